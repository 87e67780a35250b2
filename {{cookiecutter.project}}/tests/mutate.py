"""`make mutate`: mutation testing of the functions whose numbers a team spends TPU hours on, with
cosmic-ray (requirements-dev.txt).

tests/mutate.toml names each target: a module, the functions in it to mutate, and the tests that claim
them. For each target, cosmic-ray's `init` lists every mutation of the module; those outside the named
functions, in type annotations (never evaluated), and those of operators left out (`OPERATORS`), are
marked skipped in its session; each other
one is applied to a copy of the project (build/mutate/copy-N, never the sources here) and the target's
tests run on it. A mutant the tests fail on (or that times out) is killed; one they pass survives.

A surviving mutant is either a gap in the tests or equivalent: a change no input can tell apart
(tests/mutate.toml lists those, each with why). The score per module is killed / (mutants -
equivalent); below `--min-score` (90%), or with a survivor not listed, the command fails. The sessions
(build/mutate/*.sqlite, readable with cosmic-ray's `cr-report`) and build/mutate/report.json keep
the result.

    python tests/mutate.py [--jobs 2] [--only memory] [--min-score 0.9]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from collections import Counter
from pathlib import Path

try:
    import attrs
    from cosmic_ray.commands import init
    from cosmic_ray.mutating import mutate_and_test
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome, WorkResult
except ImportError as missing:
    raise SystemExit(
        f"make mutate needs cosmic-ray ({missing.name} is missing): run make setup (requirements-dev.txt)"
    ) from None

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "mutate"
LEFT_OUT = (".venv", ".git", "build", "runs", "data", "__pycache__", ".pytest_cache", ".ruff_cache")

# The operators applied: each comparison to its boundary and its negation, each arithmetic operator to
# its nearest others, numbers +-1, booleans, `and`/`or`, `not` added or removed, loops run zero times,
# break/continue, an `except` that catches nothing. Left out: the exotic binary replacements (`+` by
# `<<`, `|`, `@`...) whose kills say nothing more than `+` by `-` does, and the random variable ones.
OPERATORS = re.compile(
    r"core/("
    r"ReplaceComparisonOperator_(Lt_(LtE|GtE)|LtE_(Lt|Gt)|Gt_(GtE|LtE)|GtE_(Gt|Lt)|Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is)"
    r"|ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Div_FloorDiv|FloorDiv_Mul|Mod_FloorDiv"
    r"|Pow_Mul|Mul_Pow|BitAnd_BitOr|BitOr_BitAnd)"
    r"|ReplaceUnaryOperator_(USub_UAdd|Delete_Not)"
    r"|NumberReplacer|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr|ReplaceOrWithAnd|AddNot"
    r"|ReplaceBreakWithContinue|ReplaceContinueWithBreak|ZeroIterationForLoop|ExceptionReplacer)$"
)


def package() -> str:
    return next(p.parent.name for p in (ROOT / "src").glob("*/__init__.py"))


def function_lines(path: Path, names: list[str]) -> dict[str, range]:
    """The lines of each named function (`name` or `Class.name`) of the module at `path`."""
    tree = ast.parse(path.read_text())
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Assign) and isinstance(child.targets[0], ast.Name):
                name = f"{prefix}{child.targets[0].id}"  # a table of functions, e.g. levers.LEVERS
                if name in names:
                    found[name] = range(child.lineno, child.end_lineno + 1)
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if name in names:
                    first = min([child.lineno, *(d.lineno for d in getattr(child, "decorator_list", []))])
                    found[name] = range(first, child.end_lineno + 1)
                visit(child, f"{name}.")

    visit(tree, "")
    missing = sorted(set(names) - set(found))
    if missing:
        raise SystemExit(
            f"tests/mutate.toml: {path.relative_to(ROOT)} has no function {', '.join(missing)}: fix the name"
        )
    return found


def annotations(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (start, end) positions of the module's type annotations where they are never evaluated
    (`from __future__ import annotations`): a mutation there is no change at all."""
    spans, text = [], path.read_text()
    if "from __future__ import annotations" not in text:
        return spans
    for node in ast.walk(ast.parse(text)):
        hints = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            hints = [argument.annotation for argument in every if argument is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            hints = [node.annotation]
        spans += [((h.lineno, h.col_offset), (h.end_lineno, h.end_col_offset)) for h in hints if h is not None]
    return spans


def copy_project(index: int) -> Path:
    copy = OUT / f"copy-{index}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*LEFT_OUT))
    return copy


def mutated_line(diff: str | None) -> str:
    """The first line a mutant's diff adds, stripped: how tests/mutate.toml names an equivalent one."""
    for line in (diff or "").splitlines():
        if line.startswith("+") and not line.startswith("+++"):
            return line[1:].strip()
    return ""


def prepare(target: dict, session: Path) -> tuple[list, dict]:
    """cosmic-ray's session for the target, the mutations outside its functions or operators skipped:
    (the work items to run, the function of each)."""
    module = ROOT / "src" / package() / target["module"]
    lines = function_lines(module, target["functions"])
    hints = annotations(module)
    relative = module.relative_to(ROOT)
    with use_db(str(session), WorkDB.Mode.create) as db:
        init([relative], db, {})
        items, owner = [], {}
        for item in db.pending_work_items:
            mutation = item.mutations[0]
            function = next((name for name, span in lines.items() if mutation.start_pos[0] in span), None)
            hinted = any(start <= tuple(mutation.start_pos) < end for start, end in hints)
            if function is None or hinted or not OPERATORS.match(mutation.operator_name):
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output="not in scope"))
            else:
                items.append(item)
                owner[item.job_id] = function
    return items, owner


def test_command(target: dict, copy: Path) -> str:
    """The target's tests in `copy` (cosmic-ray splits the command as a shell would, and runs it without one)."""
    select = ["-k", target["select"]] if target.get("select") else []
    pytest = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:xdist",
        *target["tests"],
        *select,
    ]
    inner = f"cd {shlex.quote(str(copy))} && PYTHONPATH=src {shlex.join(pytest)}"
    return shlex.join(["sh", "-c", inner])


def run(target: dict, items: list, copies: list[Path], timeout: float, session: Path) -> dict:
    """Each mutant on one of the copies, `len(copies)` at once; its result into the session."""
    work: queue.Queue = queue.Queue()
    for item in items:
        work.put(item)
    results, lock, started = {}, threading.Lock(), time.perf_counter()

    def worker(copy: Path):
        command = test_command(target, copy)
        while True:
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            mutation = attrs.evolve(item.mutations[0], module_path=copy / item.mutations[0].module_path)
            result = mutate_and_test([mutation], command, timeout)
            with lock:
                results[item.job_id] = result
                with use_db(str(session), WorkDB.Mode.open) as db:
                    db.set_result(item.job_id, result)
                if result.test_outcome == TestOutcome.SURVIVED:
                    print(f"  survived: line {mutation.start_pos[0]}: {mutated_line(result.diff)}", flush=True)
                survived = sum(r.test_outcome == TestOutcome.SURVIVED for r in results.values())
                rate = len(results) / (time.perf_counter() - started)
                print(
                    f"  {target['name']}: {len(results)}/{len(items)} mutants run, {survived} survived "
                    f"({rate * 60:.1f} mutants/min)",
                    flush=True,
                )

    threads = [threading.Thread(target=worker, args=(copy,)) for copy in copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def baseline(target: dict, copy: Path) -> float:
    """The seconds the target's tests take on the unmutated copy; they must pass, or the run stops (a
    failing test would kill every mutant)."""
    started = time.perf_counter()
    done = subprocess.run(shlex.split(test_command(target, copy)), capture_output=True, text=True)
    if done.returncode:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:]
        raise SystemExit(f"{target['name']}: its tests fail before any mutation ({' '.join(tail)}): fix them first")
    return time.perf_counter() - started


def summarise(target: dict, items: list, owner: dict, results: dict, equivalents: list[dict]) -> dict:
    known = {(e["function"], e["mutant"]) for e in equivalents if e["module"] == target["module"]}
    outcomes: Counter = Counter()
    survivors, equivalent = [], []
    for item in items:
        result = results[item.job_id]
        mutation = item.mutations[0]
        if result.worker_outcome != WorkerOutcome.NORMAL:
            outcomes[str(result.worker_outcome.value)] += 1
            continue
        if result.test_outcome == TestOutcome.INCOMPETENT:
            outcomes["incompetent"] += 1
            continue
        if result.test_outcome == TestOutcome.KILLED:
            outcomes["killed"] += 1
            continue
        line = mutated_line(result.diff)
        entry = {
            "function": owner[item.job_id],
            "line": mutation.start_pos[0],
            "operator": mutation.operator_name.removeprefix("core/"),
            "mutant": line,
        }
        (equivalent if (entry["function"], line) in known else survivors).append(entry)
    counted = len(items) - len(equivalent) - sum(v for k, v in outcomes.items() if k != "killed")
    score = outcomes["killed"] / counted if counted else 1.0
    return {
        "module": target["module"],
        "functions": target["functions"],
        "mutants": len(items),
        "killed": outcomes["killed"],
        "equivalent": len(equivalent),
        "not run": {k: v for k, v in outcomes.items() if k != "killed"},
        "score": round(score, 4),
        "survivors": survivors,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once, each on its own copy")
    parser.add_argument("--only", default="", help="the targets whose name or module contains one of these (a,b)")
    parser.add_argument("--count", action="store_true", help="only count each target's mutants")
    parser.add_argument("--min-score", type=float, default=0.9, help="the least score per target")
    parser.add_argument(
        "--timeout-factor",
        type=float,
        default=4.0,
        help="a mutant's tests time out (killed) after this times their unmutated time",
    )
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    spec = tomllib.loads((ROOT / "tests" / "mutate.toml").read_text())
    only = [part for part in args.only.split(",") if part]
    targets = [t for t in spec["target"] if not only or any(p in t["name"] or p in t["module"] for p in only)]
    if not targets:
        raise SystemExit(
            f"--only {args.only!r} names no target of tests/mutate.toml: name a target or part of its module's path"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    copies = [] if args.count else [copy_project(i) for i in range(max(1, args.jobs))]
    report = []
    for target in targets:
        session = OUT / (f"{target['name']}.sqlite" if not args.count else "count.sqlite")
        items, owner = prepare(target, session)
        print(
            f"{target['name']} ({target['module']}): {len(items)} mutants in {', '.join(target['functions'])}",
            flush=True,
        )
        if args.count:
            continue
        seconds = baseline(target, copies[0])
        timeout = max(60.0, args.timeout_factor * seconds)  # a mutant that loops forever counts as killed
        print(f"  its tests pass unmutated in {seconds:.0f} s; a mutant's time out at {timeout:.0f} s", flush=True)
        results = run(target, items, copies, timeout, session)
        report.append(summarise(target, items, owner, results, spec.get("equivalent", [])))
        shown = report[-1]
        print(
            f"{shown['module']}: {shown['killed']} killed of {shown['mutants']} mutants, {shown['equivalent']} "
            f"equivalent, {len(shown['survivors'])} survived: score {shown['score']:.1%}",
            flush=True,
        )
    if args.count:
        return 0
    (OUT / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    failed = False
    for shown in report:
        for survivor in shown["survivors"]:
            print(
                f"survived: {shown['module']}:{survivor['line']} {survivor['function']} "
                f"{survivor['operator']}: {survivor['mutant']}"
            )
        failed |= shown["score"] < args.min_score or bool(shown["not run"])
        if shown["not run"]:
            print(f"{shown['module']}: mutants whose tests did not run: {shown['not run']} (cr-report SESSION: why)")
    print("module                          mutants  killed  equivalent  survived  score")
    for shown in report:
        print(
            f"{shown['module']:<32}{shown['mutants']:>7}{shown['killed']:>8}{shown['equivalent']:>12}"
            f"{len(shown['survivors']):>10}  {shown['score']:.1%}"
        )
    print(f"sessions and report.json in {OUT.relative_to(ROOT)}/ (cr-report SESSION lists each mutant)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
