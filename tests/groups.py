"""xdist groups of the heavy real-model tests (``pytest.mark.xdist_group(name)``).

Under ``pytest -n N`` the tests are distributed with ``loadgroup`` (``tests/conftest.py``):
each group runs in one worker process, so its tests share that process's caches (the
rotated device weights and the calibration kept by ``models.compiler.calibrate_wide``, the
float reference kept by ``sim.app.quality.reference_logits``), and the scheduler hands the
groups out first (it orders work units by their number of tests), one per worker, while
the single tests fill in around them: the heaviest work neither shares a worker nor is
left for the end.
"""

#: W8 weights with the rotated ``w8`` numerics (one calibration, one set of rotated
#: weights): the teacher-forced and greedy checks, the dequantize-on-read check, the
#: quality-table order and the real-model config's text run (``kvsim run``).
REAL_W8 = "real-w8"
#: The other heavy tests (the ``w4g32`` numerics; the static-int8 guard of ``evaluate``,
#: ``kvsim run``, ``kvsim eval`` and ``kvsim generate``, which share one static-int8
#: calibration), for the other worker. The real-size program hashes are four tests of
#: their own (one compile each), in no group, so the scheduler spreads them over both
#: workers.
REAL_OTHER = "real-other"
#: The two readers of one ``kvsim run`` of the embedded default (the ``embedded_default_run``
#: fixture of ``tests/conftest.py``): one worker runs it once for both.
QUICKSTART = "quickstart"
