"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class XattnError(Exception):
    """A mistake in user input (file, config key, flag); its message names the culprit."""


class ParameterError(XattnError):
    """A bad value of a library function's parameter, named as the library names it ("layer: expected a layer
    number"); the command line names the flag that sets it instead ("--layer: ...")."""

    def __init__(self, name: str, problem: str, item: tuple[str, int] | None = None):
        super().__init__(f"{item[0]}[{item[1]}]: {name}: {problem}" if item else f"{name}: {problem}")
        self.name, self.problem, self.item = name, problem, item

    def __reduce__(self):  # picklable across processes, like any XattnError
        return type(self), (self.name, self.problem, self.item)


class ItemError(ParameterError):
    """A bad item of a list parameter: `name`[`index`] (0-based), as the library names it ("texts[36]: ..."); the
    command line names the file and line it came from instead. (A ParameterError with an `item` is a setting that
    one item cannot meet: "texts[3]: min_len: ...".)"""

    def __init__(self, name: str, index: int, problem: str):
        XattnError.__init__(self, f"{name}[{index}]: {problem}")
        self.name, self.index, self.problem, self.item = name, index, problem, (name, index)

    def __reduce__(self):
        return type(self), (self.name, self.index, self.problem)
