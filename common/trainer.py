"""transformers.Trainer's plumbing for the backbone article's run: its progress on stderr, the wait for pictures
measured from outside its loop, and a dataset read once through its transform."""
import sys
import time

from common.loader import TimedLoader, dataset_loader, pass_timing


def progress_on_stderr():
    """A tqdm bar on stderr in place of the Trainer's own, whose log lines would land on stdout."""
    from tqdm import tqdm
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        bar = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.bar = tqdm(total=state.max_steps, desc="fine-tuning", unit="step", file=sys.stderr, leave=False)

        def on_step_end(self, args, state, control, **kwargs):
            self.bar.update(1)

        def on_train_end(self, args, state, control, **kwargs):
            self.bar.close()

    return Progress()


def labels_in(batch):
    return len(batch["labels"])


def time_the_passes(trainer, device):
    """({"training", "evaluations": pass timings}, filled as the Trainer runs; [the data loaders it made]).

    Its loop hides the wait for pictures, so every next() of the data loaders it makes is timed from outside
    (common/loader.py's timed: on a CUDA GPU the GPU's own idle time), and every evaluate(). Its evaluation loaders
    get no worker processes and no pinning: their pictures are preprocessed already, on the model's device, and an
    evaluation is a few batches, which workers started afresh for each would keep a GPU waiting for.
    """
    timings, made = {"training": pass_timing(), "evaluations": pass_timing()}, []
    make_train, make_eval, evaluate = trainer.get_train_dataloader, trainer.get_eval_dataloader, trainer.evaluate

    def train_loader(*a, **k):
        made.append(make_train(*a, **k))
        return TimedLoader(made[-1], timings["training"], count=labels_in, device=device)

    def eval_loader(*a, **k):
        args = trainer.args
        kept = args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory
        args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory = 0, False, False
        try:
            made.append(make_eval(*a, **k))
        finally:
            args.dataloader_num_workers, args.dataloader_persistent_workers, args.dataloader_pin_memory = kept
        return TimedLoader(made[-1], timings["evaluations"], count=labels_in, device=device)

    def timed_evaluate(*a, **k):
        begun = time.perf_counter()
        try:
            return evaluate(*a, **k)
        finally:
            timings["evaluations"]["seconds"] += time.perf_counter() - begun

    trainer.get_train_dataloader, trainer.get_eval_dataloader, trainer.evaluate = train_loader, eval_loader, \
        timed_evaluate
    return timings, made


def preprocessed(dataset, workers):
    """([every item of a dataset with a transform], the seconds it took): the transform computed once, in order, by
    `workers` processes; the items are the transform's own output, so a Trainer fed with them sees what it would
    see through the dataset."""
    begun = time.perf_counter()
    items = [item for batch in dataset_loader(dataset, list, workers) for item in batch]
    return items, time.perf_counter() - begun
