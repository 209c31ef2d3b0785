from tasks.progress import Progress


class _Log:
    def __init__(self):
        self.lines = []

    def info(self, fmt, *args):
        self.lines.append(fmt % args)


def test_progress_logs_each_tenth_once_including_integer_chunked_ticks():
    log = _Log()
    bar = Progress(log, "steps", 999_900)
    for done in range(99_990, 999_901, 99_990):  # chunks just below each tenth
        bar.update(done)
    assert [int(line.split("]")[1].split("%")[0]) for line in log.lines] == list(range(10, 101, 10))
    assert log.lines[-1].startswith("[####################] 100% steps")
