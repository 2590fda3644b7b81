"""nbgrader configuration of the course's graded assessment (this folder is the nbgrader course)."""

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

c.CourseDirectory.course_id = "mgpu-assessment"
# The release keeps the single-GPU program working: a solution region becomes a comment, not
# `raise NotImplementedError()`, so the student starts from code that runs.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE (see the instructions above)"}
# nbgrader 0.9.6's feedback would show the hidden tests' code: remove them (the grader also sets this).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
