"""The one error type users see: bad input, reported as one line, exit status 2."""


class InputError(Exception):
    """Bad input from the user (file, key, flag). The CLI prints it as one line, exits 2."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 key: str | None = None) -> None:
        self.message = " ".join(message.splitlines())  # one line, whatever it quotes
        self.file = file
        self.line = line
        self.key = key
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "") + ": "
        key = f"{self.key}: " if self.key else ""
        return f"{where}{key}{self.message}"
