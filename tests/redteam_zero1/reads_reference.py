# Red-team case for Assessment B: reads the reference weights instead of training.
# Each worker computes the reference data-parallel run with the course's own function (the
# grader's reference, from the same parameters: anything the notebook can read), holds no
# optimizer state and communicates nothing, and copies the reference's final weights into the
# model during the last step, so the final weights the locked loop saves are the reference's.
# Expected verdict: fails on "weights" (the probe step in the middle of training is not the
# reference's) and on "communication" (nothing sent).
def train():
    import horovod.tensorflow as hvd

    from mgpu import assessment_zero1 as zero1

    hvd.init()
    model = settings.model()
    final = zero1.reference_trajectory(settings)["final"]

    def train_step(step, x, y):
        if step == settings.steps - 1:
            model.set_weights(final)

    return settings.drive(model, train_step)
