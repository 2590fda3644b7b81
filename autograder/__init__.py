"""autograder: the instructor's command that grades the course's assessment.

``python -m autograder grade COURSE_DIR --assignment assessment --profile cpu --workers 2``

- ``autograder.__main__`` the command line, one function per subcommand (one-line errors for bad input)
- ``autograder.grade``    the cohort: the named steps validate, rebuild, run, check, measure, grade; copies, reports
- ``autograder.records``  the records and the course's lock (used by grade and certify)
- ``autograder.outcomes`` each assignment's outcome (what a run must achieve), chosen by the assignment
- ``autograder.course``   the nbgrader course: release, submissions, locked cells, gradebook
- ``autograder.validate`` checks on a submitted notebook before it runs
- ``autograder.runners``  where a notebook runs (this machine; ``slurm``/``node_run``: a cluster), given a RunSpec
- ``autograder.sandbox``  running a notebook under the grader's clock and limits (the watchdog), and
  its parts: ``isolation`` (namespaces, file system, user, environment), ``syscall_filter``,
  ``cgroups``, ``watch`` (workers, CPU trail), ``epochs`` (the epoch keeper), ``safe_read``, ``stop``
- ``autograder.execute``  the papermill child process the sandbox starts
- ``autograder.checks``   the test cells run again in a clean sandboxed process
- ``autograder.measure``  held-out accuracy of the saved weights, and the assessment's pass/fail decision
- ``autograder.report``   grades.csv and report.html for the cohort
- ``autograder.certify``  signs the eligible passes' certificates after grading, running no submission code
- ``autograder.certificates`` signed certificates of competency: keys, issue (JSON, PDF, PNG), verify, revoke
- ``autograder.cohort``   a demonstration cohort (reference, unconverted, crashing, ...) for tests
"""
