#!/usr/bin/env bash
# The wheels of hwbench's dependencies that the GPU device image lacks, downloaded on this
# machine for an offline install there (the device machine reaches no registry):
# benchmarks/gpu_session.sh installs them from gpu-wheels/ with pip --no-index into gpu-site/
# and puts that first on PYTHONPATH (benchmarks/README.md, "The GPU session").
#
#   benchmarks/gpu_wheels.sh                 # into gpu-wheels/ of this checkout (git-ignored)
#   benchmarks/gpu_wheels.sh --list          # what it would download, one requirement a line
#   benchmarks/gpu_wheels.sh --all           # every dependency but torch, numpy and matplotlib
#   benchmarks/gpu_wheels.sh pydantic scipy  # these requirements instead of pyproject.toml's
#
# Which: the dependencies in pyproject.toml less what the image has (torch, numpy, pandas, tabulate,
# PyYAML, tokenizers, nvidia-ml-py, pytest, scipy, Jinja2 with MarkupSafe, prometheus-client: the
# image's package list as the device tool's documentation gave it, read 2026-11-17) and less
# matplotlib, which no hwbench module imports, with their own dependencies, again less what the
# image has: today pydantic and its own, about 2.5 MiB. Every byte carried is sent at the start of
# every call, on the session's device time; `--all` downloads every dependency but torch, numpy and
# matplotlib, for an image that turns out to lack more than that list says. gpu_session.sh checks on
# the card, first thing, that every requirement of pyproject.toml is met and names any that is not. For the image's Python 3.12 on
# x86_64 Linux: binary wheels only, manylinux. Dependencies are resolved by pip, so a package
# pinned by another (pydantic-core by pydantic) comes at the pinned version: asking for it by
# name alone would fetch its newest release, which pydantic refuses. The folder is replaced
# only when the whole download succeeded, and refused above 60 MiB.
set -euo pipefail

here="$(cd "$(dirname "$0")/.." && pwd)"
py="${HWBENCH_PYTHON:-python3}"
dest="$here/gpu-wheels"
limit=$((60 * 1024 * 1024))
IMAGE_HAS="torch numpy pandas tabulate pyyaml tokenizers nvidia-ml-py pytest scipy jinja2 markupsafe prometheus-client"
NOT_IMPORTED="matplotlib"

list_only=0
requested=()
for arg in "$@"; do
  case "$arg" in
    --list) list_only=1 ;;
    --all) IMAGE_HAS="torch numpy" ;;
    -*) echo "gpu_wheels.sh: option '$arg' is not known; accepted: --list, --all, or requirements" >&2; exit 2 ;;
    *) requested+=("$arg") ;;
  esac
done

if [ ${#requested[@]} -eq 0 ]; then
  mapfile -t requested < <("$py" - "$here/pyproject.toml" "$IMAGE_HAS $NOT_IMPORTED" <<'EOF'
import re, sys, tomllib
skip = set(sys.argv[2].split())
for requirement in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]
    if re.sub(r"[-_.]+", "-", name).lower() not in skip:
        print(requirement)
EOF
)
fi
if [ "$list_only" -eq 1 ]; then
  [ ${#requested[@]} -eq 0 ] || printf '%s\n' "${requested[@]}"
  exit 0
fi
if [ ${#requested[@]} -eq 0 ]; then
  echo "gpu_wheels.sh: the image has every dependency in pyproject.toml; nothing to download"
  rm -rf "$dest"
  exit 0
fi

part="$dest.part"
rm -rf "$part"
"$py" -m pip download --quiet --dest "$part" --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 "${requested[@]}"
for wheel in "$part"/*.whl; do  # dependencies the image has: its own copy stays in use
  name="$(basename "$wheel" | cut -d- -f1 | tr '_.' '--' | tr '[:upper:]' '[:lower:]')"
  case " $IMAGE_HAS " in *" $name "*) rm -f "$wheel" ;; esac
done
size=$(du -sb "$part" | cut -f1)
if [ "$size" -gt "$limit" ]; then
  echo "gpu_wheels.sh: the wheels take $((size / 1048576)) MiB, more than 60 (the device tool carries 64 MiB);" \
       "left in $part, gpu-wheels/ unchanged" >&2
  exit 1
fi
rm -rf "$dest"
mv "$part" "$dest"
ls -1 "$dest"
echo "gpu_wheels.sh: $(ls "$dest" | wc -l) wheels, $((size / 1048576)) MiB in $dest; carry it: \"carry\": [\"gpu-wheels\"]"
