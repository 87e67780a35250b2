"""A contrastive dual encoder written into a task that `make new-task` added, as a team would: what
tests/test_generated.py::test_a_contrastive_dual_encoder_needs_no_edit_outside_its_package appends to
the new task's task.py and test file. Each CSV row's features (the query) must retrieve the row's own
record (its target and features: the document) among every other row's: two towers, an in-batch softmax over the global
batch's documents (gathered across replicas) with its temperature a config key, and recall@1 over
the whole eval split as the headline. `__task__` is replaced by the task's name.
"""

TASK_CODE = '''

# ---------------------------------------------------------------- the dual encoder
@dataclass(frozen=True)
class ObjectiveConfig:
    """The `objective:` keys."""

    temperature: float = 0.1
    """Divides the cosine similarities of queries and documents before the softmax over the global batch."""

    def problem(self) -> str | None:
        if self.temperature <= 0:
            return f"objective.temperature must be positive, got {self.temperature}"
        return None


EMBEDDING = 16


class DualEncoder(NewTask):
    """Rows' features (queries) retrieve their own records (target and features: documents) through two
    towers: in-batch negatives over the global batch, recall@1 over the whole eval split."""

    objective_config = ObjectiveConfig
    headline_metric = "recall_at_1"
    higher_is_better = True
    loss_terms = ("positive_similarity",)

    def parse_batch(self, serialized, manifest: dict, training: bool = False, seed=None, data_config=None):
        features, target = super().parse_batch(serialized, manifest, training, seed, data_config)
        return {"features": features, "target": target}, target

    def synthetic_batch(self, batch_size: int, manifest: dict):
        features, target = super().synthetic_batch(batch_size, manifest)
        return {"features": features, "target": target}, target

    def build_model(self, model_config, manifest: dict):
        from ...core.keras import keras

        layers, stats = keras.layers, manifest["statistics"]

        def tower(x, name, mean, std):
            x = layers.Rescaling((1.0 / np.asarray(std)).tolist(), offset=(-np.asarray(mean) / std).tolist())(x)
            for index, width in enumerate(model_config.hidden):
                x = layers.Dense(width, activation="relu", name=f"{name}_hidden{index}")(x)
            x = layers.Dense(EMBEDDING, dtype="float32", name=f"{name}_embedding")(x)
            return layers.UnitNormalization(dtype="float32", name=name)(x)

        inputs = {
            "features": keras.Input((manifest["num_features"],), name="features"),
            "target": keras.Input((1,), name="target"),
        }
        outputs = {
            "query": tower(inputs["features"], "query", stats["feature_mean"], stats["feature_std"]),
            "document": tower(
                layers.Concatenate(name="record")([inputs["target"], inputs["features"]]),
                "document",
                [stats["target_mean"], *stats["feature_mean"]],
                [stats["target_std"], *stats["feature_std"]],
            ),
        }
        return keras.Model(inputs, outputs, name="__task__")

    def build_step_loss(self, objective_config, manifest: dict):
        import tensorflow as tf

        from ...core.model import gather, replica_offset

        def in_batch_softmax(model, features, targets, outputs, weights):
            queries = outputs["query"]
            weights = tf.ones(tf.shape(queries)[:1]) if weights is None else tf.cast(weights, tf.float32)
            documents = gather(outputs["document"])  # every replica's: the global batch's candidates
            similarity = tf.matmul(queries, documents, transpose_b=True)
            logits = similarity / objective_config.temperature - 1e9 * (1.0 - gather(weights))[None, :]
            positives = replica_offset(queries) + tf.range(tf.shape(queries)[0])
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(positives, logits)
            mean = lambda values: tf.math.divide_no_nan(tf.reduce_sum(values * weights), tf.reduce_sum(weights))
            own = tf.gather(similarity, positives, batch_dims=1)
            return {"loss": mean(losses), "positive_similarity": mean(own)}

        return in_batch_softmax

    split_metric_names = ("recall_at_1",)

    def split_metrics(self, model, outputs, targets, objective_config, manifest: dict) -> dict:
        similarity = outputs["query"] @ outputs["document"].T  # every eval query against every eval document
        return {"recall_at_1": float(np.mean(np.argmax(similarity, axis=1) == np.arange(len(similarity))))}

    def build_serving_signature(self, model, predict_config, objective_config, manifest: dict):
        import tensorflow as tf

        from ...core.keras import keras

        query_tower = keras.Model(model.input["features"], model.get_layer("query").output)
        spec = tf.TensorSpec([None, manifest["num_features"]], tf.float32, name="features")

        @tf.function(input_signature=[spec])
        def serve(features):
            return {"embedding": query_tower(features, training=False)}

        return serve

    def predictions(self, inputs, outputs: dict, manifest: dict, export_dir: str) -> list[dict]:
        return [{"embedding": " ".join(f"{value:.3f}" for value in row[:4]) + " ..."} for row in outputs["embedding"]]


TASK = DualEncoder()
'''

TEST_CODE = '''

def test_the_gathered_in_batch_loss_has_the_one_device_gradient_on_8_replicas(strategy, tmp_path):
    """One SGD update of the same weights on the same global batch of 128: the same on the suite's 8
    replicas as on one device (the in-batch softmax sees the global batch through the gather)."""
    import tensorflow as tf
    from conftest import assert_same_updates

    from {{package}} import parity, tasks
    from {{package}}.core import config as config_lib
    from {{package}}.core.keras import keras
    from {{package}}.core.model import build_model

    cfg = config_lib.load("configs/__task__/local.yaml", [], registry=tasks)
    assert tasks.load(cfg.task) is TASK
    assert cfg.objective.temperature == 0.1
    manifest = TASK.nominal_manifest(cfg.data)
    rng = np.random.default_rng(0)
    features = rng.normal(size=(128, 8)).astype("float32")
    batch = ({"features": features, "target": features.sum(axis=1, keepdims=True)}, np.zeros((128, 1), "float32"))

    def make():
        model = build_model(cfg, TASK, manifest)
        model.compile(keras.optimizers.SGD(1.0))
        return model

    curves = parity.compare(make, [batch], tf.distribute.OneDeviceStrategy("/cpu:0"), strategy)
    assert curves.parting_step is None and curves.replicas == 8
    updates = []
    for side in (tf.distribute.OneDeviceStrategy("/cpu:0"), strategy):
        _, _, model = parity.train_curve(make, side, curves.initial, [batch])
        updates.append([after - before for after, before in zip(model.get_weights(), curves.initial)])
    assert_same_updates(*updates, curves.initial, terms=128)
    assert max(np.abs(update).max() for update in updates[0]) > 1e-3
'''
