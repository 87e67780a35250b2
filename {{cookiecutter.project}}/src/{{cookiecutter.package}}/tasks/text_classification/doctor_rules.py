"""The text classifier's `make doctor` rules: sequence length and vocabulary against the TPU's tiles
(the text tasks' shared rules), and how well `data.seq_len` fits the texts.

Each rule is a pure function of (cfg, target, manifest) -> (status, message, fix): `status` is
"pass", "warn", "fail" or "skip"; `fix` is empty for a pass. `target.kind` is "tpu", "gpu" or
"cpu" (None counts as not a TPU); `manifest` is None before preprocessing.
"""

from __future__ import annotations

from ..text.doctor_rules import MXU_TILE, SMALL_TILE, embedding_rows, on_tpu, round_up, seq_len_tiles

MAX_SHARE_TRUNCATED = 0.2
MAX_MEAN_PADDING = 0.5


def sequence_fit(cfg, target, manifest):
    """How much text `data.seq_len` cuts off (the share of texts truncated, and the mean share of a
    text's pieces the window keeps: the baselines read them all), and how much of each batch is
    padding (compute spent on nothing); both come from the lengths preprocessing measured."""
    stats = (manifest or {}).get("length_stats")
    if not stats:
        return "skip", "no length statistics (run `make preprocess` first)", ""
    seq_len = manifest.get("seq_len", cfg.data.seq_len)
    truncated, padding, mean = stats["share_truncated"], stats["mean_padding"], stats["mean_tokens"]
    kept = f", the window keeps {stats['mean_kept']:.0%} of a text's pieces" if "mean_kept" in stats else ""
    facts = (
        f"seq_len {seq_len}: {truncated:.0%} of texts truncated{kept}, {padding:.0%} of positions padding, "
        f"mean {mean:.0f} tokens"
    )
    if truncated > MAX_SHARE_TRUNCATED:
        both_ends = manifest.get("truncation") == "head_tail"
        other = "" if both_ends else ", or read the first and last pieces (data.truncation=head_tail)"
        return (
            "warn",
            f"{facts}: the baselines read whole texts, the model only its window",
            (
                f"raise data.seq_len (e.g. data.seq_len={round_up(seq_len + 1, MXU_TILE)}){other} and re-run "
                f"`make preprocess`; model.bag_width=32 adds a bag of the window's pieces beside the Transformer"
            ),
        )
    if padding > MAX_MEAN_PADDING:
        # Room for texts up to 1.5x the mean, on the tile grid of the target.
        multiple = MXU_TILE if on_tpu(target) else SMALL_TILE
        lower = max(multiple, round_up(int(mean * 1.5), multiple))
        if lower < seq_len:
            return "warn", facts, f"lower data.seq_len (e.g. data.seq_len={lower}) and re-run `make preprocess`"
    return "pass", facts, ""


def rules() -> list:
    """(name, rule) pairs, in the order doctor prints them."""
    return [
        ("data.seq_len_tiles", seq_len_tiles),
        ("model.embedding_rows", embedding_rows),
        ("data.sequence_fit", sequence_fit),
    ]
