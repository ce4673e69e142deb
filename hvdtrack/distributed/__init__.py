"""Distribution: the seam every strategy hides behind (``workers``), cores and threads per rank
(``cores``), deadlines (``watchdog``), elastic Horovod (``elastic``), launchers (``launch``), stop
signals (``stop``), pipeline parallelism in stages (``stages``), and the ``distributed:`` config
section (``config``, no TensorFlow). Nothing is imported here."""
