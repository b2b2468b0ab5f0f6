#!/usr/bin/env bash
# Pretrain a reading base in time-limited calls on a borrowed machine that keeps nothing between
# calls (a lent GPU box, a preemptible VM): each call resumes from the checkpoint the last one left.
#
#   launch/pretrain_in_chunks.sh CONFIG LIMIT_S PACK_IN PACK_OUT [--config.KEY=VALUE ...]
#
# CONFIG    a pretraining config (configs/base_v8.py)
# LIMIT_S   seconds of training in this call; then it is interrupted (steps since the last
#           checkpoint, every train.save_every, are done again by the next call)
# PACK_IN   a folder holding the previous call's run.tar.part-* (missing or empty: a fresh start)
# PACK_OUT  where this call leaves the run (vocabulary, logs and the newest checkpoint only) as
#           run.tar.part-* of 15 MiB each, and, once the run has finished, the exported base as
#           base.tar
#
# Wheels in ./.whl (packages the machine lacks) are installed into /tmp/site first. The run
# itself lives in $PRETRAIN_IN_CHUNKS_DIR/run (default /tmp/pretrain_in_chunks/run) on the machine; a
# folder of that name that this script did not make is refused, untouched.
set -uo pipefail
if [ $# -lt 4 ]; then
    sed -n 2,17p "$0" >&2
    exit 2
fi
# Absolute paths: the script runs from the repository root, wherever it was called from.
config=$(realpath -m "$1") limit=$2 pack_in=$(realpath -m "$3") pack_out=$(realpath -m "$4")
shift 4
python=${PYTHON:-python3}
work=${PRETRAIN_IN_CHUNKS_DIR:-/tmp/pretrain_in_chunks}
run=$work/run
if [ -e "$work" ] && [ ! -f "$work/.made_by_pretrain_in_chunks" ]; then
    echo "pretrain_in_chunks: $work exists and was not made by this script; not touching it" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
mkdir -p "$run" "$pack_out"
touch "$work/.made_by_pretrain_in_chunks"
if compgen -G "$pack_in/run.tar.part-*" >/dev/null; then
    cat "$pack_in"/run.tar.part-* | tar -x -C "$run" || exit 1
    echo "pretrain_in_chunks: resuming from $(ls "$run/checkpoints" | tr '\n' ' ')"
fi

timeout --signal=INT --kill-after=60 "$limit" "$python" -m memsearcher_jax.cli pretrain --config "$config" \
    --config.train.output_dir="$run" "$@"
rc=$?
echo "pretrain_in_chunks: pretrain exited $rc after at most $limit s"

# Pack what the next call needs: the vocabulary, the logs and the newest complete checkpoint
# (Orbax keeps two; one is enough to resume and halves what travels).
newest=$(ls "$run/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
members=()
for m in vocab logs summary.json; do [ -e "$run/$m" ] && members+=("$m"); done
[ -n "$newest" ] && members+=("checkpoints/$newest")
if [ ${#members[@]} -gt 0 ]; then
    rm -f "$pack_out"/run.tar.part-*
    tar -c -C "$run" "${members[@]}" | split -b 15M - "$pack_out/run.tar.part-"
fi
if [ -f "$run/summary.json" ]; then
    tar -c -C "$run" base -f "$pack_out/base.tar"
    echo "pretrain_in_chunks: finished; the base is in $pack_out/base.tar"
fi
ls -l "$pack_out"
exit "$rc"
