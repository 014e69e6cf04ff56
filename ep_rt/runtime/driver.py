"""The only module that talks to the CUDA driver (cuda-python's `cuda.bindings.driver`).

Every call goes through `check`, so a failure names the call and the CUDA error. The bindings are
imported on first use: `import ep_rt` works on machines without a GPU or driver.
"""

from __future__ import annotations

import ctypes
import functools

from ..errors import CudaDriverError
from . import choice


@functools.lru_cache(maxsize=None)
def _cu():
    from cuda.bindings import driver

    return driver


def check(result, call: str):
    """Unpack a cuda-python result tuple; raise CudaDriverError naming `call` on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    cu = _cu()
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else str(name)
        text = text.decode() if isinstance(text, bytes) else str(text)
        raise CudaDriverError(f"{call} failed: {name} ({text})")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def driver_version() -> int:
    """cuDriverGetVersion: the newest CUDA the installed driver supports, as 1000 * major + 10 * minor."""
    return int(check(_cu().cuDriverGetVersion(), "cuDriverGetVersion"))


def bindings_version() -> str:
    from cuda import bindings

    return str(bindings.__version__)


@functools.lru_cache(maxsize=None)
def _initialised() -> bool:
    # Before cuInit: a too-old driver or cuda-bindings too new for it should say so, not fail in some later call.
    choice.check_bindings(bindings_version(), driver_version())
    check(_cu().cuInit(0), "cuInit")
    return True


def ensure_context(device_index: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    _initialised()
    cu = _cu()
    ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    dev = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    if int(ctx) != 0 and int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice")) == int(dev):
        return
    primary = check(cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def compute_capability(device_index: int) -> tuple[int, int]:
    _initialised()
    cu = _cu()
    dev = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    attr = cu.CUdevice_attribute
    major = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute"
    )
    minor = check(
        cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute"
    )
    return int(major), int(minor)


def multiprocessor_count(device_index: int) -> int:
    _initialised()
    cu = _cu()
    dev = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
    return int(check(cu.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))


# ---- memory -------------------------------------------------------------------------------------

# Bytes ep_rt holds through this module, by kind: a soak checks them for growth per process (device-wide counters
# mix in every process sharing the GPU, and torch's caching allocator).
_live = {"device": {}, "host": {}}


def live_bytes() -> dict:
    return {kind: sum(sizes.values()) for kind, sizes in _live.items()}


def mem_alloc(nbytes: int) -> int:
    ptr = int(check(_cu().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes} bytes)"))
    _live["device"][ptr] = nbytes
    return ptr


def mem_free(ptr: int) -> None:
    check(_cu().cuMemFree(ptr), "cuMemFree")
    _live["device"].pop(ptr, None)


def memset_d8(ptr: int, value: int, nbytes: int) -> None:
    """Asynchronous for device memory (CUDA's API sync rules): call ctx_synchronize() before anything that lets a
    peer write into the bytes, or the memset may land on top of the peer's data."""
    check(_cu().cuMemsetD8(ptr, value, nbytes), "cuMemsetD8")


def memset_d32_async(ptr: int, value: int, count: int, stream) -> None:
    """`count` 32-bit words at `ptr` set to `value`, in the order of `stream` (a CUstream: launch.driver_stream)."""
    check(_cu().cuMemsetD32Async(ptr, value, count, stream), "cuMemsetD32Async")


def ctx_synchronize() -> None:
    """Wait for all work of the current context (a memset included) to finish."""
    check(_cu().cuCtxSynchronize(), "cuCtxSynchronize")


def mem_get_info() -> tuple[int, int]:
    free, total = check(_cu().cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


def host_alloc_mapped(nbytes: int) -> tuple[int, int]:
    """Pinned host memory mapped into the device address space: (host pointer, device pointer)."""
    cu = _cu()
    flags = cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE
    host = int(check(cu.cuMemHostAlloc(nbytes, flags), f"cuMemHostAlloc({nbytes} bytes)"))
    ctypes.memset(host, 0, nbytes)
    dev = int(check(cu.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer"))
    _live["host"][host] = nbytes
    return host, dev


def host_free(host_ptr: int) -> None:
    check(_cu().cuMemFreeHost(host_ptr), "cuMemFreeHost")
    _live["host"].pop(host_ptr, None)


# ---- IPC ----------------------------------------------------------------------------------------

IPC_HANDLE_BYTES = 64


def ipc_get_handle(ptr: int) -> bytes:
    handle = check(_cu().cuIpcGetMemHandle(ptr), "cuIpcGetMemHandle")
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)


def ipc_open_handle(handle_bytes: bytes) -> int:
    cu = _cu()
    if len(handle_bytes) != IPC_HANDLE_BYTES:
        raise ValueError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(handle_bytes)}")
    handle = cu.CUipcMemHandle()
    ctypes.memmove(handle.getPtr(), handle_bytes, IPC_HANDLE_BYTES)
    flags = cu.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
    return int(check(cu.cuIpcOpenMemHandle(handle, flags), "cuIpcOpenMemHandle"))


def ipc_close_handle(ptr: int) -> None:
    check(_cu().cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle")


# ---- modules and launches -----------------------------------------------------------------------


def module_load(image: bytes):
    """Load a cubin image; the image bytes must stay alive only for the duration of this call."""
    buf = ctypes.create_string_buffer(image, len(image))
    return check(_cu().cuModuleLoadData(ctypes.addressof(buf)), "cuModuleLoadData")


def module_unload(module) -> None:
    check(_cu().cuModuleUnload(module), "cuModuleUnload")


def module_global(module, name: str) -> tuple[int, int]:
    """(device address, bytes) of a __device__ variable of a loaded module, by its (unmangled) symbol name."""
    ptr, size = check(_cu().cuModuleGetGlobal(module, name.encode()), f"cuModuleGetGlobal({name})")
    return int(ptr), int(size)


def memcpy_dtoh(ptr: int, nbytes: int) -> bytes:
    """nbytes of device memory at `ptr` (a module's __constant__ or __device__ variable), copied to the host;
    synchronous."""
    buf = (ctypes.c_uint8 * nbytes)()
    check(_cu().cuMemcpyDtoH(ctypes.addressof(buf), ptr, nbytes), "cuMemcpyDtoH")
    return bytes(buf)


def module_function(module, name: str):
    return check(_cu().cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")


def set_max_dynamic_smem(function, nbytes: int) -> None:
    attr = _cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(_cu().cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute(max dynamic shared memory)")


def max_active_blocks(function, block: int, smem: int) -> int:
    """How many blocks of `function` one SM holds at once (registers, shared memory, threads)."""
    return check(
        _cu().cuOccupancyMaxActiveBlocksPerMultiprocessor(function, block, smem),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    )


def make_stream(handle: int):
    return _cu().CUstream(handle)


def make_event(handle: int):
    """The CUevent of a CUDA event made elsewhere (torch.cuda.Event's cuda_event, which owns it)."""
    return _cu().CUevent(handle)


def record_and_wait(event, waitee, waiter) -> None:
    """`waiter` waits for the work queued on `waitee` so far: `event` recorded on waitee, then waited for by waiter
    (CUstreams, launch.driver_stream). Inside a graph capture these are the capture's edges, as torch's are. The
    results are tested inline (CUDA_SUCCESS is 0): check() costs 0.1-0.2 us, and every call makes two fences."""
    cu = _cu()
    err = cu.cuEventRecord(event, waitee)[0]
    if err:
        check((err,), "cuEventRecord")
    err = cu.cuStreamWaitEvent(waiter, event, 0)[0]
    if err:
        check((err,), "cuStreamWaitEvent")


def launch(function, grid: int, block: int, smem: int, stream, params_address: int, name: str) -> None:
    check(
        _cu().cuLaunchKernel(function, grid, 1, 1, block, 1, 1, smem, stream, params_address, 0),
        f"cuLaunchKernel({name})",
    )


def make_launch_config(cooperative: bool, cluster: int, programmatic: bool = False):
    """A reusable CUlaunchConfig carrying launch attributes (cooperative, cluster size, programmatic dependent
    launch: the kernel may start once every block of the previous kernel on the stream has asked for it)."""
    cu = _cu()
    attrs = []
    if programmatic:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        attrs.append(attr)
    if cooperative:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
        attr.value.cooperative = 1
        attrs.append(attr)
    if cluster > 1:
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
        attrs.append(attr)
    config = cu.CUlaunchConfig()
    config.gridDimY = config.gridDimZ = config.blockDimY = config.blockDimZ = 1
    config.attrs = attrs
    config.numAttrs = len(attrs)
    return config


def launch_ex(config, function, grid: int, block: int, smem: int, stream, params_address: int, name: str) -> None:
    config.gridDimX, config.blockDimX, config.sharedMemBytes, config.hStream = grid, block, smem, stream
    check(_cu().cuLaunchKernelEx(config, function, params_address, 0), f"cuLaunchKernelEx({name})")


def _device_attributes(device_index: int, names: dict) -> dict:
    """{key: the driver's raw value of attribute CU_DEVICE_ATTRIBUTE_<names[key]>} of one device, in names' order."""
    _initialised()
    cu = _cu()
    dev = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    attr = cu.CUdevice_attribute
    return {
        key: int(
            check(
                cu.cuDeviceGetAttribute(getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}"), dev),
                f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{name})",
            )
        )
        for key, name in names.items()
    }


def gpudirect_rdma_attributes(device_index: int) -> dict:
    """How a device treats memory a NIC writes into (GPUDirect RDMA), as the driver's raw values: "supported"
    (GPU_DIRECT_RDMA_SUPPORTED, 0/1), "ordering" (GPU_DIRECT_RDMA_WRITES_ORDERING: CUGPUDirectRDMAWritesOrdering,
    0 none / 100 owner / 200 all devices) and "flush_options" (GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: a mask of
    CUflushGPUDirectRDMAWritesOptions, 1 host / 2 memops)."""
    names = {
        "supported": "GPU_DIRECT_RDMA_SUPPORTED",
        "ordering": "GPU_DIRECT_RDMA_WRITES_ORDERING",
        "flush_options": "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS",
    }
    return _device_attributes(device_index, names)


def host_memory_attributes(device_index: int) -> dict:
    """What CUDA promises when the CPU and this GPU touch the same words at once, as the driver's raw 0/1 values:
    "host_native_atomic" (HOST_NATIVE_ATOMIC_SUPPORTED: the link to the host carries atomics natively, which the CUDA
    C++ library's concurrency rules require for an atomic in host memory that CPU and GPU threads use concurrently)
    and "concurrent_managed" (CONCURRENT_MANAGED_ACCESS, the same rule's condition for managed memory)."""
    names = {"host_native_atomic": "HOST_NATIVE_ATOMIC_SUPPORTED", "concurrent_managed": "CONCURRENT_MANAGED_ACCESS"}
    return _device_attributes(device_index, names)


def pci_bus_id(device_index: int) -> str:
    _initialised()
    cu = _cu()
    dev = check(cu.cuDeviceGet(device_index), "cuDeviceGet")
    raw = check(cu.cuDeviceGetPCIBusId(32, dev), "cuDeviceGetPCIBusId")
    raw = raw if isinstance(raw, (bytes, bytearray)) else bytes(raw)
    return raw.split(b"\0", 1)[0].decode()
