"""The planner: pure and synchronous. Jit cache (PlanItems) -> Plan (a message list per queue)."""

from ._bounds import Bounds as Bounds
from ._bounds import item_dependencies as item_dependencies
from ._bounds import lower_bounds as lower_bounds
from ._errors import ActorGraphError as ActorGraphError
from ._errors import PlanDeadlockError as PlanDeadlockError
from ._errors import PlanError as PlanError
from ._errors import PlanRaceError as PlanRaceError
from ._messages import Message as Message
from ._messages import Run as Run
from ._messages import Signal as Signal
from ._messages import SyncDevice as SyncDevice
from ._messages import Wait as Wait
from ._messages import WaitKick as WaitKick
from ._order import list_schedule_order as list_schedule_order
from ._plan import Plan as Plan
from ._planner import assign_queue as assign_queue
from ._planner import build_plan as build_plan
from ._ranges import RangeTracker as RangeTracker
from ._records import Access as Access
from ._records import DeviceCaps as DeviceCaps
from ._records import ItemKind as ItemKind
from ._records import PlanItem as PlanItem
from ._records import QueueId as QueueId
from ._records import QueueKind as QueueKind
from ._verify import verify_plan as verify_plan

__all__ = [
    "Access",
    "ActorGraphError",
    "Bounds",
    "DeviceCaps",
    "ItemKind",
    "Message",
    "Plan",
    "PlanDeadlockError",
    "PlanError",
    "PlanItem",
    "PlanRaceError",
    "QueueId",
    "QueueKind",
    "RangeTracker",
    "Run",
    "Signal",
    "SyncDevice",
    "Wait",
    "WaitKick",
    "assign_queue",
    "build_plan",
    "item_dependencies",
    "list_schedule_order",
    "lower_bounds",
    "verify_plan",
]
