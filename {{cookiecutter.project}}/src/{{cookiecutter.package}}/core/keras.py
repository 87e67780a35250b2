"""The one import of Keras in this project.

We use tf_keras (the Keras 2 API, kept in step with TensorFlow): under TF 2.20/2.21, Keras 3's
`model.fit` fails with `steps_per_execution > 1` on a multi-replica MirroredStrategy fed by
`distribute_datasets_from_function` (an InvalidArgumentError about a placeholder in
`multi_step_on_iterator`), and tests/test_train.py runs exactly that setup to catch it. To try
Keras 3 again, change the import below to `import keras` and run `make test`.
"""

import tf_keras as keras  # noqa: F401

__all__ = ["keras"]
