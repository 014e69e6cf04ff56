"""The call plans an op keeps (issue 23, docs/HOST_PATH.md): a call's parameter structs for one shape, built once
and reused; at most MAX_PLANS per op, past that dropped and rebuilt as calls need them."""

import ctypes

MAX_PLANS = 64


def copy_struct(dst, src) -> None:
    """A call plan's parameter struct into a launcher's (same type; the launcher's fixed fields are in the plan
    too): one memmove."""
    ctypes.memmove(ctypes.addressof(dst), ctypes.addressof(src), ctypes.sizeof(src))


def plan_for(op, key: tuple, build):
    """op.call_plans[key], built by build(*key) the first time. op.call_plans is made on first use (a class
    attribute None until then), so an op built with object.__new__, as the CPU tests do, has it too."""
    plans = op.call_plans
    if plans is None:
        plans = op.call_plans = {}
    plan = plans.get(key)
    if plan is None:
        plan = build(*key)
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plans[key] = plan
    return plan
