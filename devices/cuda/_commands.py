"""Stream commands: what a CUDA queue actor puts on its stream or into a CUDA graph.

A lowered item is a tuple of commands (plain tuples, so a replay builds nothing):

    (KERNEL, function, grid, block, pointers, ints, host_body)
    (COPY, kind, dst, src, nbytes, dst_context, src_context)
                                    the contexts own the GPU sides (None: host memory)
    (HOST, fn)                      a host function, in stream order (staging copies)
    (WAIT_VALUE, pointer, value)    cuStreamWaitValue64 GEQ
    (WRITE_VALUE, pointer, value)   cuStreamWriteValue64

`enqueue` puts one on a stream; `add_node` adds one to a graph after `after`;
`update_node` changes an instantiated graph's node to a command of the same shape.
"""

from __future__ import annotations

from typing import Any

from ._driver import CudaDriver

KERNEL = 0
COPY = 1
HOST = 2
WAIT_VALUE = 3
WRITE_VALUE = 4

Command = tuple[Any, ...]


def enqueue(driver: CudaDriver, stream: Any, cmd: Command) -> None:
    code = cmd[0]
    if code == KERNEL:
        driver.launch_kernel(stream, cmd[1], cmd[2], cmd[3], cmd[4], cmd[5], cmd[6])
    elif code == COPY:
        driver.memcpy(stream, cmd[1], cmd[2], cmd[3], cmd[4], cmd[5], cmd[6])
    elif code == HOST:
        driver.launch_host_func(stream, cmd[1])
    elif code == WAIT_VALUE:
        driver.stream_wait_value64(stream, cmd[1], cmd[2])
    elif code == WRITE_VALUE:
        driver.stream_write_value64(stream, cmd[1], cmd[2])
    else:
        raise ValueError(f"unknown stream command {cmd!r}")


def add_node(driver: CudaDriver, graph: Any, after: Any, context: Any, cmd: Command) -> Any:
    code = cmd[0]
    if code == KERNEL:
        return driver.graph_add_kernel(graph, after, cmd[1], cmd[2], cmd[3], cmd[4], cmd[5], cmd[6])
    if code == COPY:
        return driver.graph_add_memcpy(graph, after, context, cmd[1], cmd[2], cmd[3], cmd[4])
    if code == HOST:
        return driver.graph_add_host(graph, after, cmd[1])
    if code == WAIT_VALUE:
        return driver.graph_add_wait_value64(graph, after, context, cmd[1], cmd[2])
    if code == WRITE_VALUE:
        return driver.graph_add_write_value64(graph, after, context, cmd[1], cmd[2])
    raise ValueError(f"unknown graph command {cmd!r}")


def shape_of(cmd: Command) -> Any:
    """What must match for a graph node to be updated in place rather than rebuilt."""
    code = cmd[0]
    if code == KERNEL:
        return (KERNEL, cmd[1])
    if code == COPY:
        # The driver updates a memcpy node only between memory of the same contexts.
        return (COPY, cmd[1], cmd[5], cmd[6])
    if code == HOST:
        return (HOST, cmd[1])  # host functions are compared by identity: rebuilt if new
    return (code, cmd[1])  # a mem-op node's value may change in place, its address not


def update_node(
    driver: CudaDriver, graph_exec: Any, node: Any, context: Any, old: Command, new: Command
) -> bool:
    """Bring `node` from `old` to `new` (same shape); return True if anything changed."""
    code = new[0]
    if code == KERNEL:
        if old[:6] == new[:6]:
            return False
        driver.graph_exec_kernel_update(graph_exec, node, *new[1:7])
    elif code == COPY:
        if old == new:
            return False
        driver.graph_exec_memcpy_update(graph_exec, node, context, *new[1:5])
    elif code in (WAIT_VALUE, WRITE_VALUE):
        if old == new:
            return False
        driver.graph_exec_value_update(
            graph_exec, node, context, new[1], new[2], code == WAIT_VALUE
        )
    else:
        return False
    return True
