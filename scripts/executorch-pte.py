#!/usr/bin/env python3
"""Writes ExecuTorch programs (.pte) without PyTorch: JSON in, the executorch wheel's flatc out.

    scripts/executorch-pte.py --executorch DIR --out DIR

DIR is the installed `executorch` package (the wheel's site-packages/executorch): its
data/bin/flatc and exir/_serialize/program.fbs + scalar_type.fbs turn each program's JSON into
the binary flatbuffer the runtime loads. Writes, into --out:

  topk_49152.pte    aten::topk.values(x[1, 49152] f32, k=40, dim=-1, largest, sorted): the
  topk_262144.pte   sampling step over SmolLM2's and Gemma 3's vocabularies. The portable
                    kernel (libexecutorch_kernels_optimized.so) takes a queue of 16 bytes per
                    element of the row from ctx.allocate_temp.
  sdpa_decode.pte   one call per layer (30, SmolLM2) of ca_example::sdpa_decode_scratch.out,
                    a kernel crates/capi/examples/executorch-programs registers: the KV length
                    is the input (an int64 tensor: ExecuTorch bakes Int inputs into the
                    program), and each call takes op_sdpa_impl.h's two scratch buffers.

Memory planning is done here by hand: every tensor lives in planned buffer 1 at a fixed
offset (buffer 0 is reserved, as exir's memory planning leaves it). Every program has one
method, "forward". Only the standard library is needed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ALIGN = 16  # exir's default memory-planning alignment


def tensor(scalar_type, sizes, offset):
    """An EValue holding a planned, static-shape, contiguous tensor at `offset` of buffer 1."""
    return {
        "val_type": "Tensor",
        "val": {
            "scalar_type": scalar_type,
            "storage_offset": 0,
            "sizes": sizes,
            "dim_order": list(range(len(sizes))),
            "requires_grad": False,
            "data_buffer_idx": 0,
            "allocation_info": {
                "memory_id": 1,
                "memory_offset_low": offset & 0xFFFFFFFF,
                "memory_offset_high": offset >> 32,
            },
            "layout": 0,
            "shape_dynamism": "STATIC",
        },
    }


def int_value(v):
    return {"val_type": "Int", "val": {"int_val": v}}


def bool_value(v):
    return {"val_type": "Bool", "val": {"bool_val": v}}


def tensor_list(items):
    return {"val_type": "TensorList", "val": {"items": items}}


ELEMENT_BYTES = {"FLOAT": 4, "LONG": 8}


class Planner:
    """Places tensors one after another in planned buffer 1."""

    def __init__(self):
        self.size = 0

    def place(self, scalar_type, sizes):
        numel = 1
        for s in sizes:
            numel *= s
        offset = self.size
        self.size += (numel * ELEMENT_BYTES[scalar_type] + ALIGN - 1) // ALIGN * ALIGN
        return tensor(scalar_type, sizes, offset)


def program(values, inputs, outputs, operators, calls, planned_bytes):
    instructions = [
        {"instr_args_type": "KernelCall", "instr_args": {"op_index": op, "args": args}}
        for op, args in calls
    ]
    return {
        "version": 0,
        "execution_plan": [
            {
                "name": "forward",
                "container_meta_type": {"encoded_inp_str": "", "encoded_out_str": ""},
                "values": values,
                "inputs": inputs,
                "outputs": outputs,
                "chains": [
                    {"inputs": inputs, "outputs": outputs, "instructions": instructions}
                ],
                "operators": [{"name": n, "overload": o} for n, o in operators],
                "delegates": [],
                "non_const_buffer_sizes": [0, planned_bytes],
            }
        ],
        # No constants. As exir serializes that: an empty constant segment holding only the
        # placeholder offset 0 (the runtime refuses the deprecated constant_buffer path), and
        # no extended header, since no segment has data.
        "backend_delegate_data": [],
        "segments": [{"offset": 0, "size": 0}],
        "constant_segment": {"segment_index": 0, "offsets": [0]},
    }


def topk_program(row, k=40):
    p = Planner()
    values = [
        p.place("FLOAT", [1, row]),  # 0: x (input)
        int_value(k),  # 1
        int_value(-1),  # 2: dim
        bool_value(True),  # 3: largest
        bool_value(True),  # 4: sorted
        p.place("FLOAT", [1, k]),  # 5: values (out)
        p.place("LONG", [1, k]),  # 6: indices (out)
        tensor_list([5, 6]),  # 7: the returned tuple, as exir emits it
    ]
    calls = [(0, [0, 1, 2, 3, 4, 5, 6, 7])]
    return program(values, [0], [5, 6], [("aten::topk", "values")], calls, p.size)


# SmolLM2-135M's attention, as op_sdpa_impl.h would size its scratch for it: head_dim 64,
# 3 KV heads, 30 layers; 8 threads (the num_threads the sizes are computed for).
DECODE_LAYERS = 30
DECODE_HEADS = 3
DECODE_HEAD_DIM = 64
DECODE_THREADS = 8


def sdpa_decode_program():
    p = Planner()
    values = [
        p.place("LONG", [1]),  # 0: KV length (input)
        int_value(DECODE_THREADS),  # 1
        int_value(DECODE_HEADS),  # 2
        int_value(DECODE_HEAD_DIM),  # 3
        p.place("FLOAT", [DECODE_LAYERS]),  # 4: one result per layer (out)
    ]
    layer_ids = []
    for layer in range(DECODE_LAYERS):
        layer_ids.append(len(values))
        values.append(int_value(layer))
    # ca_example::sdpa_decode_scratch.out(Tensor kv_len, int layer, int threads, int heads,
    #     int head_dim, *, Tensor(a!) out) -> Tensor(a!): args, then the return (= out).
    calls = [(0, [0, layer_ids[layer], 1, 2, 3, 4, 4]) for layer in range(DECODE_LAYERS)]
    ops = [("ca_example::sdpa_decode_scratch", "out")]
    return program(values, [0], [4], ops, calls, p.size)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--executorch", required=True, help="the installed executorch package")
    ap.add_argument("--out", required=True, help="directory for the .pte files")
    args = ap.parse_args()
    flatc = os.path.join(args.executorch, "data", "bin", "flatc")
    schema = os.path.join(args.executorch, "exir", "_serialize", "program.fbs")
    for f in (flatc, schema):
        if not os.path.exists(f):
            sys.exit(f"executorch-pte.py: {f} is missing: give --executorch the wheel's "
                     "site-packages/executorch directory (pip install executorch==1.5.1)")
    os.makedirs(args.out, exist_ok=True)
    programs = {
        "topk_49152": topk_program(49152),
        "topk_262144": topk_program(262144),
        "sdpa_decode": sdpa_decode_program(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, prog in programs.items():
            src = os.path.join(tmp, name + ".json")
            with open(src, "w") as f:
                json.dump(prog, f)
            # -b: binary from JSON; the file extension "pte" comes from the schema.
            subprocess.run([flatc, "-b", "-o", args.out, schema, src], check=True)
            print(f"wrote {os.path.join(args.out, name + '.pte')}")


if __name__ == "__main__":
    main()
