"""A worker's slots as threads: one per slot, each running its loop; a slot loop
that ends by an unexpected error (a defect) stops the worker, so the tokens the slot
held are handed back rather than kept leased by the live heartbeat."""

from __future__ import annotations

import logging
import threading

from streamq.work.slot import Slot, SlotWorker

log = logging.getLogger("streamq.worker")


def slot_threads(worker: SlotWorker) -> list[threading.Thread]:
    """One thread per slot of ``worker`` (not started)."""

    def serve(slot: Slot) -> None:
        try:
            slot.run()
        except BaseException:
            # a slot loop that ends by an error (a defect) would leave its tokens leased
            # by the live heartbeat: the worker stops instead, so they are handed back
            log.exception("worker slot %d stopped by an unexpected error; the worker stops",
                          slot.index)
            if worker.fatal is None:
                worker.fatal = f"worker slot {slot.index} stopped by an unexpected error"
            worker.stopping.set()
        finally:
            worker.watchdog.stop()  # the slot's handler thread, if it made one

    return [threading.Thread(target=serve, args=(Slot(worker, i),), name=f"streamq-slot-{i}",
                             daemon=True)
            for i in range(worker.slots)]
