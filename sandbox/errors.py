"""The sandbox's one exception: the command could not be started. Every other outcome is a RunResult."""


class SandboxStartError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
