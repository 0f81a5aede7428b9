"""What every dashboard screen shares."""

from __future__ import annotations

from textual.worker import Worker, WorkerState


class ReportsWorkerErrors:
    """Screens hand their failed workers to the app's one handler (Harlequin's pattern):
    Textual tells only the node that started a worker."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            self.app.worker_failed(event.worker)  # type: ignore[attr-defined]
