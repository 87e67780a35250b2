#!/usr/bin/env bash
# Takes in a newer version of the template this project was generated from (`make template-update`).
#
# .cruft.json records the template, the template commit the project came from and the answers.
# cruft generates the project twice with those answers, at that commit and at the template's newest
# commit (TEMPLATE_REF=<branch, tag or commit> for another), and applies the difference between the
# two to this project with git's three-way merge: what the template changed is changed here, what
# it added appears, what it no longer generates is deleted, and your own edits stay. A line that
# both you and the template changed becomes a conflict for you to resolve.
#
# It runs in a clean git work tree, on a new branch (BRANCH, default template-update), and commits
# the update there when it applies cleanly; you review it and merge. On a conflict it stops on the
# branch with the list of files to resolve.
#
#   BRANCH        the branch to create (default template-update; it must not exist yet)
#   TEMPLATE_REF  the template branch, tag or commit to update to (default: its newest commit)
#   CRUFT         the cruft executable (make passes the project's .venv/bin/cruft)
#   PYTHON        a Python to read .cruft.json with (default python3)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

branch="${BRANCH:-template-update}"
ref="${TEMPLATE_REF:-}"
cruft="${CRUFT:-cruft}"
python="${PYTHON:-python3}"

[ -f .cruft.json ] || die "no .cruft.json, so the template this project came from is unknown: record it once with" \
    "cruft link <template-url> --checkout <the template commit it was generated from>, commit, and run this again"
git rev-parse --verify -q HEAD >/dev/null 2>&1 || die "the update merges the template's changes into your" \
    "commits, and this folder has none: git init; git add -A; git commit -m 'Generated project'"
[ -z "$(git status --porcelain)" ] || die "the work tree has uncommitted changes: commit or stash them first (git status)"
command -v "$cruft" >/dev/null 2>&1 || die "cruft is not installed: make setup (requirements-dev.txt has it), or pip install cruft"
read -r template commit < <("$python" -c 'import json; s = json.load(open(".cruft.json")); print(s["template"], s.get("commit") or "-")')
[ "$commit" != - ] || die ".cruft.json records no template commit (the project was generated from a folder that is not" \
    "a git checkout): cruft link $template --checkout <the template commit it was generated from>"
if git rev-parse --verify -q "refs/heads/$branch" >/dev/null; then
    die "branch $branch exists already: merge or delete it (git branch -D $branch), or pass BRANCH=<another name>"
fi

start=$(git rev-parse --abbrev-ref HEAD)
run git switch -q -c "$branch"
update=("$cruft" update --skip-apply-ask)
[ -z "$ref" ] || update+=(--checkout "$ref")
run "${update[@]}"

conflicts=$(git diff --name-only --diff-filter=U)
rejects=$(git ls-files --others --exclude-standard -- '*.rej')
if [ -n "$conflicts$rejects" ]; then
    # shellcheck disable=SC2086  # one file name per word in the message
    die "the template update conflicts with your edits in:" $conflicts $rejects "-- resolve them on branch" \
        "$branch (the <<<<<<< markers; a .rej file holds a hunk to apply by hand), git add them and commit;" \
        "or drop the update: git reset --hard; git switch $start; git branch -D $branch"
fi
if [ -z "$(git status --porcelain)" ]; then
    run git switch -q "$start"
    run git branch -q -D "$branch"
    echo "Already up to date with $template at ${commit:0:12}."
    exit 0
fi
new=$("$python" -c 'import json; print(json.load(open(".cruft.json"))["commit"])')
run git add -A
run git commit -q -m "Update from the template: ${commit:0:12} -> ${new:0:12}" -m "$template"
echo "Updated on branch $branch (template ${commit:0:12} -> ${new:0:12})."
echo "Review it with: git diff $start...$branch   then merge: git switch $start && git merge $branch"
