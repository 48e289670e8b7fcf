"""DeepEP's event objects: an EventHandle records the current CUDA stream;
EventOverlap lets the caller wait for it (current_stream_wait, `with`).
Every libmoeep call runs on the current stream, so these only order work on
other streams; on the host backend (CPU tensors) calls have finished when
they return and the events are empty."""


class EventHandle:
    """A CUDA event recorded on the current stream when made (none without CUDA)."""

    def __init__(self, device=None):
        self.event = None
        import torch
        if torch.cuda.is_available() and (device is None or getattr(device, "type", device) == "cuda"):
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream())

    def current_stream_wait(self):
        if self.event is not None:
            import torch
            torch.cuda.current_stream().wait_event(self.event)


class EventOverlap:
    """event: an EventHandle (or None); extra_tensors: tensors kept alive until
    the event was waited for, as DeepEP's record_stream substitute."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors
        self._release_handle_by_call = False
        self.hook_after_wait = None

    def current_stream_wait(self, release_handle=False):
        assert self.event is not None
        self.event.current_stream_wait()
        if self.hook_after_wait is not None:
            hook, self.hook_after_wait = self.hook_after_wait, None
            hook()
        if release_handle:
            self.event = None

    def register_hook_after_wait(self, hook_after_wait):
        assert self.hook_after_wait is None, "A hook is already registered on this `EventOverlap`"
        self.hook_after_wait = hook_after_wait

    def __call__(self, release_handle=False):
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        if self.event is not None:
            self.current_stream_wait(release_handle=self._release_handle_by_call)
        self._release_handle_by_call = False
