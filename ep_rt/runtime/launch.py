"""Kernel launches with pre-packed arguments.

Each kernel takes one parameter struct (kernels_src/include/ep_rt/params.h, mirrored in runtime/abi.py).
A Launcher owns one instance of it and the `void*[1]` array pointing at it, so a launch only updates
the fields that change and passes one integer address to cuLaunchKernel (the driver copies the
struct at launch time, so it can be reused at once). Launch attributes (cooperative, cluster) go
through cuLaunchKernelEx with a config built once. The block size is the one the kernel is compiled for, from its
cubin's manifest entry (modules.kernel_block): no caller names it.
"""

from __future__ import annotations

import ctypes

from . import abi, driver
from .modules import LoadedModule, kernel_block

_streams: dict[int, object] = {}
_launches = 0  # kernels this process launched through a Launcher (the bad-input catalogue reads it)


def launch_count() -> int:
    """How many kernels this process has launched through Launchers (every ep_rt kernel goes through one): a
    test reads it before and after a call to tell whether any ep_rt kernel ran. Launches by torch or by NVSHMEM's
    host library are not counted."""
    return _launches


def _counted() -> None:
    global _launches
    _launches += 1


def driver_stream(torch_stream) -> object:
    """The CUstream of a torch.cuda.Stream (cached by handle)."""
    handle = int(torch_stream.cuda_stream)
    stream = _streams.get(handle)
    if stream is None:
        stream = _streams[handle] = driver.make_stream(handle)
    return stream


class Launcher:
    def __init__(
        self,
        module: LoadedModule,
        name: str,
        params_type: type,
        smem: int = 0,
        cooperative: bool = False,
        cluster: int = 1,
    ):
        self.name = name
        self.block = kernel_block(module.entry, name)  # threads per block (grid arithmetic reads it here too)
        self.function = module.function(name)
        self.smem = smem
        self.params = params_type()
        self._args = (ctypes.c_void_p * 1)(ctypes.addressof(self.params))
        self._args_address = ctypes.addressof(self._args)
        self._config = driver.make_launch_config(cooperative, cluster) if (cooperative or cluster > 1) else None
        self._early_config = None  # built on first use: building it costs tens of microseconds of Python
        if smem > 48 * 1024:
            driver.set_max_dynamic_smem(self.function, smem)

    def set(self, **fields) -> "Launcher":
        """Write parameter fields by name; a name that is no field of the struct raises AttributeError naming the
        nearest fields (the fields named before it are written). The check costs nothing until ctypes refuses a
        name (the mirrors have no instance __dict__: runtime/abi.py Mirror)."""
        params = self.params
        try:
            for key, value in fields.items():
                setattr(params, key, value)
        except AttributeError:
            names = abi.field_names(type(self.params))
            unknown = next((key for key in fields if key not in names), None)
            if unknown is None:
                raise
            raise abi.unknown_field(type(self.params), unknown) from None
        return self

    def __call__(self, grid: int, stream, smem: int | None = None, early: bool = False) -> None:
        """Launch on `stream`. early=True: a programmatic dependent launch (see snapshot), for kernels that wait for
        the previous kernel's results through memory flags only."""
        smem = self.smem if smem is None else smem
        if early:
            if self._early_config is None:
                self._early_config = driver.make_launch_config(False, 1, programmatic=True)
            driver.launch_ex(
                self._early_config,
                self.function,
                grid,
                self.block,
                smem,
                driver_stream(stream),
                self._args_address,
                self.name,
            )
        elif self._config is None:
            driver.launch(self.function, grid, self.block, smem, driver_stream(stream), self._args_address, self.name)
        else:
            driver.launch_ex(
                self._config,
                self.function,
                grid,
                self.block,
                smem,
                driver_stream(stream),
                self._args_address,
                self.name,
            )
        _counted()

    def snapshot(self):
        """A launch with the current parameters frozen (for receive hooks that run after later calls).
        launch(grid, stream, early=True) is a programmatic dependent launch: it may start while the previous
        kernel on the stream still runs, once all that kernel's blocks have executed griddepcontrol.launch_dependents
        (only for kernels that synchronise with it through memory flags, as the LL receive kernels do)."""
        params = type(self.params).from_buffer_copy(self.params)
        args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        function, block, name = self.function, self.block, self.name
        if self._early_config is None:
            self._early_config = driver.make_launch_config(False, 1, programmatic=True)
        # One config per Launcher: launch_ex sets every per-launch field right before each use.
        early_config = self._early_config

        def launch(grid: int, stream, early: bool = False, _keep=(params, args)):
            if early:
                driver.launch_ex(
                    early_config, function, grid, block, 0, driver_stream(stream), ctypes.addressof(args), name
                )
            else:
                driver.launch(function, grid, block, 0, driver_stream(stream), ctypes.addressof(args), name)
            _counted()

        return launch
