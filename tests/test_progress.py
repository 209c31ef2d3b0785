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


def test_the_running_stage_follows_its_bars_and_an_estimated_total_still_ends_at_100():
    """The flow's progress artifact moves at each tick of the stage's bar (not of a contract check's); a bar whose
    total was an estimate (the evaluation's) shows its end."""
    from tasks.progress import stage_listener

    log, seen = _Log(), []
    with stage_listener(seen.append):
        bar = Progress(log, "evaluation", 1000)
        for _ in range(99):
            bar.advance(10)
        Progress(log, "partitions validated", 1, stage=False).update(1)
        bar.update(bar.total)
    assert seen == [i / 10 for i in range(1, 11)]
    assert "[####################] 100% evaluation" in log.lines
    assert sum("validated" in line for line in log.lines) == 1


def test_work_in_coarse_pieces_still_gets_a_line_for_every_tenth():
    """12 partitions: 8.3 % each; every tenth gets its line when the partition that reaches it is done."""
    log = _Log()
    bar = Progress(log, "partitions", 12)
    for _ in range(12):
        bar.advance()
    assert [int(line.split("]")[1].split("%")[0]) for line in log.lines] == list(range(10, 101, 10))
