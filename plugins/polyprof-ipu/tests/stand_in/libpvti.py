"""A stand-in for libpvti's Python module, shaped after the documented PVTI API (createTraceChannel,
Tracepoint as a context manager, Tracepoint.event, Graph/addSeries/Series.add). It records what it is
asked, as libpvti would write it to its own trace file, so tests can check every call still reaches it."""

calls: list[tuple] = []


class TraceChannel:
    def __init__(self, name):
        self.name = name


def createTraceChannel(name):  # noqa: N802 - libpvti's name
    return TraceChannel(name)


class Tracepoint:
    def __init__(self, channel, label):
        self.channel, self.label = channel, label

    def __enter__(self):
        calls.append(("begin", self.channel.name, self.label))
        return self

    def __exit__(self, *exc):
        calls.append(("end", self.channel.name, self.label))
        return False

    @staticmethod
    def event(channel, label):
        calls.append(("event", channel.name, label))


class Series:
    def __init__(self, name):
        self.name = name

    def add(self, value):
        calls.append(("sample", self.name, value))


class Graph:
    def __init__(self, name, unit=""):
        self.name, self.unit = name, unit

    def addSeries(self, name):  # noqa: N802
        return Series(name)
