"""autograder: the instructor's command that grades the course's assessment.

``python -m autograder grade COURSE_DIR --assignment assessment --profile cpu --workers 2``

- ``autograder.__main__`` the command line (one-line errors for bad input)
- ``autograder.grade``    the cohort: validate, restore, run, measure, autograde, feedback, report
- ``autograder.course``   the nbgrader course: release, submissions, locked cells, gradebook
- ``autograder.validate`` checks on a submitted notebook before it runs
- ``autograder.sandbox``  running a notebook under the grader's clock and limits, and killing it
- ``autograder.execute``  the papermill child process the sandbox starts
- ``autograder.measure``  held-out accuracy of the saved weights, and the pass/fail decision
- ``autograder.report``   grades.csv and report.html for the cohort
- ``autograder.certify``  signs the eligible passes' certificates after grading, running no submission code
- ``autograder.certificates`` signed certificates of competency: keys, issue (JSON, PDF, PNG), verify, revoke
- ``autograder.cohort``   a demonstration cohort (reference, unconverted, crashing, ...) for tests
"""
