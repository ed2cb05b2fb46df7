"""actorgraph: replay captured device work across many devices with trio actors."""

from actorgraph.devices import PRESETS as SIM_PRESETS
from actorgraph.devices import CostModel as CostModel
from actorgraph.devices import DeviceCost as DeviceCost
from actorgraph.devices import LinkCost as LinkCost
from actorgraph.devices import Network as Network
from actorgraph.devices import SimRecord as SimRecord
from actorgraph.devices import Topology as Topology
from actorgraph.devices import Work as Work

from ._background import BackgroundGraph as BackgroundGraph
from ._background import BackgroundRuntime as BackgroundRuntime
from ._background import start_runtime as start_runtime
from ._buffer import Buffer as Buffer
from ._call import Call as Call
from ._collectives import all_reduce as all_reduce
from ._errors import ActorGraphError as ActorGraphError
from ._errors import BufferFreedError as BufferFreedError
from ._errors import ClosedError as ClosedError
from ._errors import DeadlockError as DeadlockError
from ._errors import DeviceError as DeviceError
from ._errors import GraphvizError as GraphvizError
from ._errors import InputError as InputError
from ._errors import ItemError as ItemError
from ._errors import MissingExtraError as MissingExtraError
from ._errors import PlanDeadlockError as PlanDeadlockError
from ._errors import PlanError as PlanError
from ._errors import PlanRaceError as PlanRaceError
from ._errors import ReplayMismatchError as ReplayMismatchError
from ._errors import UsageError as UsageError
from ._errors import VarError as VarError
from ._foreign import ExternalTimeline as ExternalTimeline
from ._graph import Graph as Graph
from ._graph import Replay as Replay
from ._inventory import Inventory as Inventory
from ._inventory import local_devices as local_devices
from ._jit import JitFunction as JitFunction
from ._jit import JitTraceError as JitTraceError
from ._jit import JitWarning as JitWarning
from ._jit import jit as jit
from ._kernel import Copy as Copy
from ._kernel import Kernel as Kernel
from ._kernel import Launch as Launch
from ._plot import plot_timeline as plot_timeline
from ._profile import EventKind as EventKind
from ._profile import Profile as Profile
from ._profile import ProfileEvent as ProfileEvent
from ._profile import ReplaySpan as ReplaySpan
from ._profile import WaitKind as WaitKind
from ._profile import WaitRecord as WaitRecord
from ._runtime import Runtime as Runtime
from ._runtime import open_runtime as open_runtime
from ._sim import clear_sim_timeline as clear_sim_timeline
from ._sim import sim_bounds as sim_bounds
from ._sim import sim_durations as sim_durations
from ._sim import sim_nodes as sim_nodes
from ._sim import sim_reorder as sim_reorder
from ._sim import sim_timeline as sim_timeline
from ._trace import write_trace as write_trace
from ._vars import Expr as Expr
from ._vars import Var as Var
from ._vars import cdiv as cdiv

__version__ = "0.1.0"

__all__ = [
    "ActorGraphError",
    "BackgroundGraph",
    "BackgroundRuntime",
    "Buffer",
    "BufferFreedError",
    "Call",
    "ClosedError",
    "Copy",
    "CostModel",
    "DeadlockError",
    "DeviceCost",
    "DeviceError",
    "EventKind",
    "Expr",
    "ExternalTimeline",
    "Graph",
    "GraphvizError",
    "InputError",
    "Inventory",
    "ItemError",
    "JitFunction",
    "JitTraceError",
    "JitWarning",
    "Kernel",
    "Launch",
    "LinkCost",
    "MissingExtraError",
    "Network",
    "PlanDeadlockError",
    "PlanError",
    "PlanRaceError",
    "Profile",
    "ProfileEvent",
    "Replay",
    "ReplayMismatchError",
    "ReplaySpan",
    "Runtime",
    "SIM_PRESETS",
    "SimRecord",
    "Topology",
    "UsageError",
    "Var",
    "VarError",
    "WaitKind",
    "WaitRecord",
    "Work",
    "all_reduce",
    "cdiv",
    "clear_sim_timeline",
    "jit",
    "local_devices",
    "open_runtime",
    "plot_timeline",
    "sim_bounds",
    "sim_durations",
    "sim_nodes",
    "sim_reorder",
    "sim_timeline",
    "start_runtime",
    "write_trace",
]
