#!/usr/bin/env bash
# ExecuTorch programs run by ExecuTorch's own runtime with each temp allocator, in one command:
#
#   scripts/executorch-programs.sh [--quick] [--rounds N] [--json FILE]
#
# Builds what it needs: the `executorch` 1.5.1 wheel in a venv (target/executorch-venv, --no-deps:
# no PyTorch), the C library (scripts/install-capi.sh into target/executorch-programs/prefix),
# the runner (crates/capi/examples/executorch-programs, with the wheel's CMake package) and the
# programs (scripts/executorch-pte.py: top-k over 49,152 and 262,144 floats, the SDPA decode
# scratch pattern over 30 layers). Then checks that a truncated program and one with a wrong
# magic are refused with a clear error, runs every program with every temp allocator (one
# process each, so no allocator inherits another's heap state), and prints a table: time per
# execute (median and range over the rounds after one warm-up round), heap calls and page
# faults per execute after warm-up, the temp high-water mark (largest bytes asked for between
# two resets), and whether the outputs are bit-equal across allocators (and correct).
# --json FILE writes the records (program, allocator, outputs_equal, heap_calls_per_execute,
# page_faults_per_execute, time_per_execute_ns {median, min, max}, temp_peak_bytes, ...).
#
# Then the temp plan (the C ABI's ca_plan_*, through ExecuTorchTempAllocator): the scratch
# high-water mark of every kernel call, printed and written to target/executorch-programs/
# plan-<program>.json, the decode program's compared with op_sdpa_impl.h's formula at the
# largest KV length; each program then runs on a fixed buffer of exactly the plan's maximum
# (no failed allocate_temp, same outputs) and fails cleanly on one byte less.
#
# Fails if outputs differ, a result is wrong, an allocate_temp failed, or
# ExecuTorchTempAllocator ("caching") makes a heap call or a page fault per execute after
# warm-up. --quick: fewer executes (CI). Needs python3 with venv, g++ (glibc: the heap
# counter interposes glibc's malloc) and PyPI the first time (cmake comes from there too).
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

json=""
quick=()
rounds=5
while [[ $# -gt 0 ]]; do
    case "$1" in
        --json) json="${2:?--json needs a file}"; shift 2 ;;
        --json=*) json="${1#--json=}"; shift ;;
        --quick) quick=(--quick); shift ;;
        --rounds) rounds="${2:?--rounds needs a number}"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "executorch-programs.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

work="$repo/target/executorch-programs"
mkdir -p "$work"
step() { echo "--- $*" >&2; }

step "the executorch 1.5.1 wheel (venv target/executorch-venv)"
venv="$repo/target/executorch-venv"
if [[ ! -x "$venv/bin/pip" ]]; then
    python3 -m venv "$venv" || {
        rm -rf "$venv"
        apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv "$venv"
    }
fi
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps executorch==1.5.1 cmake==3.31.10
et=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/executorch

step "the C library (scripts/install-capi.sh)"
scripts/install-capi.sh --prefix "$work/prefix" >"$work/install.log" 2>&1 \
    || { cat "$work/install.log" >&2; exit 1; }

step "the runner (crates/capi/examples/executorch-programs)"
"$venv/bin/cmake" -S crates/capi/examples/executorch-programs -B "$work/build" \
    -DCMAKE_PREFIX_PATH="$work/prefix;$et" -DCMAKE_BUILD_TYPE=Release >"$work/configure.log" \
    || { cat "$work/configure.log" >&2; exit 1; }
"$venv/bin/cmake" --build "$work/build" -j 2 >"$work/build.log" 2>&1 \
    || { cat "$work/build.log" >&2; exit 1; }
runner="$work/build/executorch_programs"

step "the programs (scripts/executorch-pte.py)"
python3 scripts/executorch-pte.py --executorch "$et" --out "$work/programs" >&2

step "bad program files are refused with a clear error"
head -c 300 "$work/programs/sdpa_decode.pte" >"$work/truncated.pte"
cp "$work/programs/topk_49152.pte" "$work/bad-magic.pte"
printf 'XX99' | dd of="$work/bad-magic.pte" bs=1 seek=4 conv=notrunc status=none
for bad in truncated bad-magic; do
    rc=0
    "$runner" --allocator caching "$work/$bad.pte" >/dev/null 2>"$work/$bad.log" || rc=$?
    if [[ $rc != 2 ]] || ! grep -q "is not an ExecuTorch program" "$work/$bad.log"; then
        echo "executorch-programs.sh: $bad.pte: expected exit 2 and a clear error, got exit $rc:" >&2
        cat "$work/$bad.log" >&2
        exit 1
    fi
    echo "  $bad.pte: $(tail -n 1 "$work/$bad.log")" >&2
done

step "each program with each temp allocator (${quick[*]:-full} mode, $rounds rounds after a warm-up)"
records="$work/records.jsonl"
: >"$records"
for program in topk_49152 topk_262144 sdpa_decode; do
    for allocator in malloc platform exact-cache caching fixed; do
        if ! "$runner" --allocator "$allocator" --rounds "$rounds" "${quick[@]}" \
            "$work/programs/$program.pte" >>"$records" 2>"$work/run.log"; then
            echo "executorch-programs.sh: $program with $allocator failed:" >&2
            cat "$work/run.log" >&2
            exit 1
        fi
    done
done

step "temp plan: per kernel call, then a fixed buffer of exactly its maximum, and one byte less"
for program in topk_49152 topk_262144 sdpa_decode; do
    plan="$work/plan-$program.json"
    "$runner" --allocator caching --rounds 1 "${quick[@]}" --plan "$plan" \
        "$work/programs/$program.pte" >"$work/plan.out" 2>"$work/run.log" \
        || { echo "executorch-programs.sh: the temp plan of $program failed:" >&2; cat "$work/plan.out" "$work/run.log" >&2; exit 1; }
    grep -v '^{' "$work/plan.out" | cut -c1-160
    max=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_bytes"])' "$plan")
    caching_hash=$(grep '^{' "$work/plan.out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["outputs_hash"])')
    # Exactly the plan's maximum: runs, no failed allocate_temp, the same outputs.
    "$runner" --allocator fixed --fixed-bytes "$max" --rounds 1 "${quick[@]}" \
        "$work/programs/$program.pte" >"$work/fixed.out" 2>"$work/run.log" \
        || { echo "executorch-programs.sh: $program on a fixed buffer of the plan's $max bytes failed:" >&2; cat "$work/run.log" >&2; exit 1; }
    python3 - "$work/fixed.out" "$caching_hash" "$max" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
ok = r["failed_allocate_temp"] == 0 and r["outputs_hash"] == sys.argv[2] and r["outputs_correct"]
print(f"  fixed buffer of {sys.argv[3]} bytes: {r['failed_allocate_temp']} failed allocate_temp, "
      f"outputs {'equal' if ok else 'DIFFERENT'}")
sys.exit(0 if ok else 1)
PY
    # One byte less: a clean failure. The decode kernel and (in 1.5.1) the portable top-k fail
    # the execute with MemoryAllocationFailed; a kernel that falls back to the heap instead
    # shows as failed allocate_temp calls.
    rc=0
    "$runner" --allocator fixed --fixed-bytes "$((max - 1))" --rounds 1 "${quick[@]}" \
        "$work/programs/$program.pte" >"$work/fixed.out" 2>"$work/run.log" || rc=$?
    if [[ $rc == 1 ]] && grep -q "execute failed: Error::MemoryAllocationFailed" "$work/run.log"; then
        echo "  one byte less: execute fails cleanly: $(sed -n 's/.*execute failed: //p' "$work/run.log")"
    elif [[ $rc == 0 ]] && python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["failed_allocate_temp"] > 0 else 1)' "$work/fixed.out"; then
        echo "  one byte less: every allocate_temp refused ($(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["failed_allocate_temp"])' "$work/fixed.out") calls); top-k fell back to the heap, outputs still checked"
    else
        echo "executorch-programs.sh: $program on $((max - 1)) bytes did not fail cleanly (exit $rc):" >&2
        cat "$work/run.log" >&2
        exit 1
    fi
done

step "table"
python3 - "$records" "$json" <<'PY'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
by_program = {}
for r in records:
    by_program.setdefault(r["program"], []).append(r)
failures = []
for program, rs in by_program.items():
    hashes = {r["outputs_hash"] for r in rs}
    for r in rs:
        r["outputs_equal"] = len(hashes) == 1 and r["outputs_correct"]
        if not r["outputs_equal"]:
            failures.append(f"{program}/{r['allocator']}: outputs differ or are wrong")
        if r["failed_allocate_temp"]:
            failures.append(f"{program}/{r['allocator']}: {r['failed_allocate_temp']} failed allocate_temp")
        if r["allocator"] == "caching" and (r["heap_calls_per_execute"] or r["page_faults_per_execute"]):
            failures.append(f"{program}/caching: {r['heap_calls_per_execute']} heap calls, "
                            f"{r['page_faults_per_execute']} page faults per execute after warm-up (target 0)")
head = f"{'program':<12} {'allocator':<12} {'time/execute us: median (min-max)':>36} {'vs fixed':>8} {'heap calls':>10} {'faults':>7} {'temp peak B':>12} {'equal':>5}"
print(head)
print("-" * len(head))
for program, rs in by_program.items():
    floor = next(r for r in rs if r["allocator"] == "fixed")["time_per_execute_ns"]["median"]
    for r in rs:
        t = r["time_per_execute_ns"]
        span = f"{t['median']/1e3:.1f} ({t['min']/1e3:.1f}-{t['max']/1e3:.1f})"
        print(f"{program:<12} {r['allocator']:<12} {span:>36} {t['median']/floor:>8.2f} "
              f"{r['heap_calls_per_execute']:>10.2f} {r['page_faults_per_execute']:>7.2f} "
              f"{r['temp_peak_bytes']:>12} {'yes' if r['outputs_equal'] else 'NO':>5}")
print("heap calls, faults: per execute after warm-up; vs fixed: median over the fixed buffer's median")
if sys.argv[2]:
    with open(sys.argv[2], "w") as f:
        json.dump(records, f, indent=1)
    print(f"wrote {len(records)} records to {sys.argv[2]}")
if failures:
    print("executorch-programs.sh: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
    sys.exit(1)
PY
