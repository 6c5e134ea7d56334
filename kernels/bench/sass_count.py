"""Compiles one kernels/cuda unit to sm_90 machine code without a GPU and counts its instructions.

Why: the decode kernels are issue-bound in places (kernels/docs/fp8-kv-cache.md), so a change to a loop can be
judged by the SASS it compiles to before it reaches a device. This uses NVIDIA's NVRTC (the same
compiler sov calls at run time, through ctypes) and nvdisasm from the pip wheels
`nvidia-cuda-nvrtc`, `nvidia-cuda-nvdisasm` and `nvidia-cuda-cuobjdump` (13.x; tested with 13.5, and
with NVRTC 13.0.88, the version CI installs):
    pip install "nvidia-cuda-nvrtc>=13,<14" "nvidia-cuda-nvdisasm>=13,<14" "nvidia-cuda-cuobjdump>=13,<14"
Headers are inlined as sov-kernels does (`#include "common.cuh"` and friends replaced by the file).

Usage: python3 kernels/bench/sass_count.py UNIT.cu [-DNAME=VALUE ...] [--arch sm_90] [--ops]
Prints per kernel: registers, spill bytes, instruction count, and for each loop (a backward branch)
its instruction count by opcode family, so a change's effect on a loop body is one diff away.
Example (the e4m3 decode attention at the Llama-3-8B heads):
    python3 kernels/bench/sass_count.py decode_attention_mma.cu -DHEAD_DIM=128 -DGQA_GROUP=4 -DKV_FP8 -DSTAGES=2
"""
import collections
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CUDA_DIR = os.path.join(HERE, "..", "cuda")


def nvidia_dir():
    import nvidia  # the pip wheels' namespace package

    for base in nvidia.__path__:
        for sub in ("cu13", "cuda_nvrtc"):
            if os.path.isdir(os.path.join(base, sub)):
                return os.path.join(base, sub)
    sys.exit("sass_count: install nvidia-cuda-nvrtc and nvidia-cuda-nvdisasm (see the docstring)")


def inline(name, seen=None):
    seen = seen if seen is not None else set()
    text = open(os.path.join(CUDA_DIR, name)).read()

    def repl(m):
        inc = m.group(1)
        if inc in seen:
            return ""
        seen.add(inc)
        return inline(inc, seen)

    return re.sub(r'^#include "([^"]+)"\s*$', repl, text, flags=re.M)


def compile_cubin(source, options, libdir):
    # NVRTC opens its builtins library by name at compile time; some wheels (13.0) do not find it
    # beside themselves, so it is loaded first, which satisfies that lookup.
    for builtins in sorted(glob.glob(os.path.join(libdir, "lib", "libnvrtc-builtins.so*"))):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            break
    lib = ctypes.CDLL(sorted(glob.glob(os.path.join(libdir, "lib", "libnvrtc.so*")))[0])
    prog = ctypes.c_void_p()
    check = lambda rc, what: rc == 0 or sys.exit(f"sass_count: {what} failed ({rc})")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"unit.cu", 0, None, None), "create")
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc != 0:
        sys.exit(f"sass_count: NVRTC failed:\n{log.value.decode()}")
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetCUBIN(prog, cubin), "get cubin")
    return cubin.raw


def family(op):
    op = op.split(".")[0]
    groups = {
        "mma": ("HMMA", "IMMA", "QMMA"),
        "shared ld/st": ("LDS", "STS", "LDSM", "LDGSTS"),
        "global ld/st": ("LDG", "STG", "LD", "ST", "RED", "ATOM", "ATOMG"),
        "convert": ("F2FP", "F2F", "I2F", "F2I", "I2FP", "F2IP", "HADD2.F32"),
        "float": ("FADD", "FMUL", "FFMA", "FMNMX", "MUFU", "FSEL", "FSETP", "HADD2", "HMUL2", "HFMA2"),
        "int/logic": ("IADD3", "IMAD", "LOP3", "SHF", "LEA", "PRMT", "ISETP", "SEL", "IABS", "IMNMX", "MOV", "S2R", "S2UR", "CS2R", "SGXT", "BMSK", "POPC", "FLO", "VIADD", "VIMNMX", "ULDC", "UMOV", "UIADD3", "ULEA", "USHF", "ULOP3", "UISETP", "UIMAD"),
        "warp": ("SHFL", "VOTE", "BAR", "DEPBAR", "WARPSYNC", "MEMBAR", "ERRBAR", "CCTL"),
        "branch": ("BRA", "BSSY", "BSYNC", "EXIT", "RET", "CALL", "NOP", "YIELD"),
    }
    for g, ops in groups.items():
        if op in ops:
            return g
    return op


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        sys.exit(__doc__)
    unit, arch, show_ops = args[0], "sm_90", "--ops" in args
    defines = [a for a in args[1:] if a.startswith("-D")]
    if "--arch" in args:
        arch = args[args.index("--arch") + 1]
    libdir = nvidia_dir()
    cubin = compile_cubin(inline(unit), [f"--gpu-architecture={arch}", "-lineinfo"] + defines, libdir)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        sass = subprocess.run([os.path.join(libdir, "bin", "nvdisasm"), "-c", path],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(libdir, "bin", "cuobjdump"), "-res-usage", path],
                               capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    resources = dict(re.findall(r"Function (\S+):\s*\n\s*(REG:\d+ STACK:\d+ SHARED:\d+ LOCAL:\d+)", usage))
    kernels = collections.OrderedDict()
    labels = {}
    current, pending = None, []
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line) or re.match(r"^([A-Za-z_$][^:\s]*):\s*$", line)
        if m and not m.group(1).startswith(".L"):
            current = m.group(1)
            kernels.setdefault(current, [])
            continue
        m = re.match(r"^(\.L\w+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);", line)
        if m and current:
            addr = int(m.group(1), 16)
            for label in pending:
                labels[label] = addr
            pending = []
            kernels[current].append((addr, m.group(3), m.group(4)))
    for name, ins in kernels.items():
        if not ins or name.startswith("$"):
            continue
        print(f"{name}: {len(ins)} instructions, {resources.get(name, 'resources unknown')}")
        loops = []
        for addr, op, operands in ins:
            if op.startswith("BRA"):
                t = re.search(r"\(([.\w]+)\)", operands)
                target = labels.get(t.group(1)) if t else None
                if target is not None and target < addr:
                    loops.append((target, addr))
        for lo, hi in loops:
            body = [op for a, op, _ in ins if lo <= a <= hi]
            fams = collections.Counter(family(op) for op in body)
            print(f"  loop {lo:#06x}..{hi:#06x}: {len(body)} instructions: "
                  + ", ".join(f"{k} {v}" for k, v in fams.most_common()))
            if show_ops:
                ops = collections.Counter(op for op in body)
                print("    " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
