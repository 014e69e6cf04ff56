#!/usr/bin/env python3
"""One CUDA-12 cubin from NVRTC (+ nvJitLink for device-linked families), through ctypes on the pip wheels'
libnvrtc.so.12 and libnvJitLink.so.12: no CUDA toolkit installed.

    python tools/nvrtc_build.py JOB.json      (tools/build_cubins.py writes the job and runs this)

The job (JSON): {"nvrtc": lib path, "nvjitlink": lib path or null, "source": path, "nvrtc_options": [...],
"link_options": [...] or null, "libraries": [paths], "output": path}. Paths are relative to the working directory
(the build's staging folder), so nothing machine-specific reaches the compiler. Each job runs in a process of its
own: the build tool can run several at once (each with its own working directory), and a crash in a vendor
library cannot take the build tool down with it. Standard library only.
"""

import ctypes
import json
import sys

NVJITLINK_INPUT_CUBIN, NVJITLINK_INPUT_LIBRARY = 1, 6


class JobError(Exception):
    pass


def _read_log(size_fn, log_fn, handle):
    size = ctypes.c_size_t()
    if size_fn(handle, ctypes.byref(size)) != 0 or size.value <= 1:
        return ""
    buf = ctypes.create_string_buffer(size.value)
    log_fn(handle, buf)
    return buf.value.decode(errors="replace").strip()


def _strings(items):
    array = (ctypes.c_char_p * len(items))(*[s.encode() for s in items])
    return len(items), array


def nvrtc_compile(lib_path, source, options):
    """The cubin NVRTC makes of `source` (ET_EXEC, or ET_REL with --relocatable-device-code=true)."""
    lib = ctypes.CDLL(lib_path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    with open(source, "rb") as f:
        text = f.read()
    prog = ctypes.c_void_p()
    ret = lib.nvrtcCreateProgram(ctypes.byref(prog), text, source.encode(), 0, None, None)
    if ret != 0:
        raise JobError(f"nvrtcCreateProgram({source}): {lib.nvrtcGetErrorString(ret).decode()}")
    try:
        n, opts = _strings(options)
        ret = lib.nvrtcCompileProgram(prog, n, opts)
        log = _read_log(lib.nvrtcGetProgramLogSize, lib.nvrtcGetProgramLog, prog)
        if ret != 0:
            raise JobError(f"NVRTC failed on {source}: {lib.nvrtcGetErrorString(ret).decode()}\n{log}")
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or size.value == 0:
            raise JobError(f"NVRTC made no cubin for {source} (is --gpu-architecture an sm_XX, not compute_XX?)")
        cubin = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, cubin)
        return cubin.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _jitlink_functions(lib_path):
    """nvJitLink's entry points as the 12.x header binds them (versioned names such as __nvJitLinkCreate_12_9)."""
    lib = ctypes.CDLL(lib_path)
    major, minor = ctypes.c_uint(), ctypes.c_uint()
    if lib.nvJitLinkVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        raise JobError(f"nvJitLinkVersion failed in {lib_path}")
    suffix = f"_{major.value}_{minor.value}"
    names = (
        "Create",
        "Destroy",
        "AddData",
        "AddFile",
        "Complete",
        "GetLinkedCubinSize",
        "GetLinkedCubin",
        "GetErrorLogSize",
        "GetErrorLog",
        "GetInfoLogSize",
        "GetInfoLog",
    )
    return {n: getattr(lib, f"__nvJitLink{n}{suffix}") for n in names}


def nvjitlink(lib_path, rel_cubin, name, options, libraries):
    """Device-link a relocatable cubin with static device libraries into one loadable cubin."""
    fn = _jitlink_functions(lib_path)
    handle = ctypes.c_void_p()
    # nvJitLink keeps the input's name pointer until Complete (its error messages print it): keep the bytes alive.
    name_bytes = name.encode()
    n, opts = _strings(options)
    if fn["Create"](ctypes.byref(handle), n, opts) != 0:
        raise JobError(f"nvJitLinkCreate rejected the options {options}")
    try:

        def checked(ret, what):
            if ret != 0:
                log = _read_log(fn["GetErrorLogSize"], fn["GetErrorLog"], handle)
                raise JobError(f"nvJitLink {what} failed (error {ret}):\n{log}")

        checked(fn["AddData"](handle, NVJITLINK_INPUT_CUBIN, rel_cubin, len(rel_cubin), name_bytes), "AddData")
        for library in libraries:
            checked(fn["AddFile"](handle, NVJITLINK_INPUT_LIBRARY, library.encode()), f"AddFile({library})")
        checked(fn["Complete"](handle), "Complete")
        size = ctypes.c_size_t()
        checked(fn["GetLinkedCubinSize"](handle, ctypes.byref(size)), "GetLinkedCubinSize")
        cubin = ctypes.create_string_buffer(size.value)
        checked(fn["GetLinkedCubin"](handle, cubin), "GetLinkedCubin")
        return cubin.raw
    finally:
        fn["Destroy"](ctypes.byref(handle))


def run(job):
    cubin = nvrtc_compile(job["nvrtc"], job["source"], job["nvrtc_options"])
    if job.get("link_options") is not None:
        if not job.get("nvjitlink"):
            raise JobError("a device-linked job needs the nvjitlink library path")
        cubin = nvjitlink(job["nvjitlink"], cubin, job["source"], job["link_options"], job.get("libraries", []))
    with open(job["output"], "wb") as f:
        f.write(cubin)


def main(argv):
    if len(argv) != 1:
        print("usage: nvrtc_build.py JOB.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            run(json.load(f))
    except (JobError, OSError, KeyError, ValueError) as e:
        print(f"nvrtc_build: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
