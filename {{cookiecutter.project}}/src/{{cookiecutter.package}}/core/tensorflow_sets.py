"""The TensorFlow sets of requirements.txt: the default pins, and each alternative set that replaces
some of them together (tensorflow, tf-keras, tensorboard, and what must move with them).

requirements.txt lists the default set as plain requirement lines, and each alternative and the TPU
facts as comment lines that pip and setuptools ignore:

    # TF=2.19: tensorflow==2.19.1 tf-keras==2.19.0 tensorboard==2.19.0 apache-beam[gcp]==2.75.0
    # TPU VM, TF=2.19: libtpu==0.0.10
    # TPU VM default: TF=2.19

A set is named by its TensorFlow minor version; the default set's name comes from its tensorflow
line. `make setup` (scripts/setup.sh), `make tpu-create` (tpu.mk, for the Pod image's version),
the Dockerfile and `make doctor` all read the sets through this file, which runs as a plain
script too (standard library only: setup.sh calls it before any virtual environment exists):

    python3 src/<package>/core/tensorflow_sets.py [--requirements FILE] [--set 2.19 | --tpu-vm]
        [--print requirements | name | tensorflow | libtpu]
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

REQUIREMENTS = Path(__file__).resolve().parents[3] / "requirements.txt"

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_ALTERNATIVE = re.compile(r"^#\s*TF=(\d+\.\d+):\s*(.+)$")
_TPU_PINS = re.compile(r"^#\s*TPU VM, TF=(\d+\.\d+):\s*(.+)$")
_TPU_DEFAULT = re.compile(r"^#\s*TPU VM default:\s*TF=(\d+\.\d+)\s*$")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line ('tf_keras==2.20.1' -> 'tf-keras')."""
    match = _NAME.match(requirement)
    if not match:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _version(requirements: Sequence[str], name: str) -> str | None:
    for line in requirements:
        if _name(line) == name and "==" in line:
            return line.split("==", 1)[1].split(";")[0].strip()
    return None


@dataclass(frozen=True)
class Sets:
    default: str
    """The default set's name, e.g. '2.20'."""
    requirements: dict[str, list[str]]
    """Each set's requirement lines, the default's in the file's order."""
    tpu_pins: dict[str, list[str]]
    """What a TPU VM adds to each set (libtpu)."""
    tpu_default: str
    """The set `make setup` installs on a TPU VM when TF is not given."""

    def names(self) -> list[str]:
        return sorted(self.requirements, key=lambda name: tuple(int(part) for part in name.split(".")))

    def resolve(self, chosen: str | None, tpu_vm: bool) -> str:
        """The set to install: `chosen` (TF=...), else the TPU VM default on a TPU VM, else the default."""
        name = chosen or (self.tpu_default if tpu_vm else self.default)
        if name not in self.requirements:
            raise ValueError(
                f"TF={name} is not a TensorFlow set of requirements.txt; choose one of {', '.join(self.names())}"
            )
        return name

    def tensorflow(self, name: str) -> str:
        """The tensorflow (and tensorflow-tpu) version of set `name`, e.g. '2.19.1'."""
        return _version(self.requirements[name], "tensorflow") or ""


def parse(text: str) -> Sets:
    default_lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    default_tf = _version(default_lines, "tensorflow")
    if not default_tf:
        raise ValueError("requirements.txt has no 'tensorflow==X.Y.Z' line")
    default = ".".join(default_tf.split(".")[:2])
    requirements, tpu_pins, tpu_default = {default: default_lines}, {}, default
    for line in text.splitlines():
        line = line.strip()
        if match := _ALTERNATIVE.match(line):
            replacements = match.group(2).split()
            replaced = {_name(requirement) for requirement in replacements}
            unknown = replaced - {_name(requirement) for requirement in default_lines}
            if unknown:
                raise ValueError(f"TF={match.group(1)} replaces {', '.join(sorted(unknown))}, not in the default set")
            requirements[match.group(1)] = [
                next((new for new in replacements if _name(new) == _name(old)), old) for old in default_lines
            ]
        elif match := _TPU_PINS.match(line):
            tpu_pins[match.group(1)] = match.group(2).split()
        elif match := _TPU_DEFAULT.match(line):
            tpu_default = match.group(1)
    if tpu_default not in requirements:
        raise ValueError(f"the TPU VM default TF={tpu_default} is not a set of requirements.txt")
    return Sets(default, requirements, tpu_pins, tpu_default)


def load(path: Path | str = REQUIREMENTS) -> Sets:
    return parse(Path(path).read_text())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Print a TensorFlow set of requirements.txt.")
    parser.add_argument("--requirements", default=str(REQUIREMENTS))
    parser.add_argument("--set", default="", help="a set's name (TF=...); empty: the default for this machine")
    parser.add_argument("--tpu-vm", action="store_true", help="resolve for a TPU VM (its default set, libtpu)")
    parser.add_argument("--print", default="requirements", choices=("requirements", "name", "tensorflow", "libtpu"))
    args = parser.parse_args(argv)
    try:
        sets = load(args.requirements)
        name = sets.resolve(args.set or None, args.tpu_vm)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.print == "name":
        print(name)
    elif args.print == "tensorflow":
        print(sets.tensorflow(name))
    elif args.print == "libtpu":
        print(" ".join(sets.tpu_pins.get(name, [])))
    else:
        print("\n".join(sets.requirements[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
