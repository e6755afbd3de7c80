"""Hugging Face checkpoints: load by id or local directory, quietly, with one line when one cannot be had."""
import os

from common.errors import UserError


def hub_offline():
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def hub_reachable(name, repo_type="model"):
    """Whether name can be downloaded now, the project's one rule: HF_HUB_OFFLINE is not set and the Hub answers about
    it within 10 s (no download retries); a name the Hub does not know is a UserError."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if hub_offline():
        return False
    what = "dataset" if repo_type == "dataset" else "checkpoint"
    try:
        HfApi().repo_info(name, repo_type=repo_type, timeout=10)
    except GatedRepoError as error:  # a RepositoryNotFoundError too: said first
        raise UserError(f"{what} {name} is gated on the Hugging Face Hub: accept its terms on its page and log in "
                        f"(hf auth login)") from error
    except RepositoryNotFoundError as error:
        raise UserError(f"{what} {name} does not exist on the Hugging Face Hub; check the name") from error
    except Exception:  # noqa: BLE001 - any failure to reach the Hub means: do not try to download
        return False
    return True


def why_no_download():
    return "HF_HUB_OFFLINE=1 forbids downloads" if hub_offline() else "the Hugging Face Hub cannot be reached"


def check_model_flag(name):
    """--model must be a checkpoint directory, or else a name the Hub's own rule takes as a repository id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name.strip():
        raise UserError("--model is empty: pass a saved checkpoint directory or a Hub id")
    if os.path.isdir(os.path.expanduser(name)):
        return
    try:
        validate_repo_id(name)
    except HFValidationError:
        what = "is a file, not a checkpoint directory" if os.path.exists(name) else "does not exist"
        raise UserError(f"--model {name}: the directory {what}; pass a saved checkpoint directory or a Hub id") from None


def checkpoint_config(name):
    """The checkpoint's config when it is on disk (a directory or the local cache), else None. Reads no weights."""
    from transformers import AutoConfig

    check_model_flag(name)
    try:
        return AutoConfig.from_pretrained(os.path.expanduser(name), local_files_only=True)
    except (OSError, ValueError):
        return None


def load_pretrained(model_class, name, **kwargs):
    """model_class.from_pretrained(name) from a local directory, the cache (so offline after one download), or the
    Hub; the library's notes on loading silenced (the scripts say them in their words)."""
    from transformers.utils import logging

    check_model_flag(name)
    name, level = os.path.expanduser(name), logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        if os.path.isdir(name):
            try:
                return model_class.from_pretrained(name, **kwargs)
            except OSError as error:
                raise UserError(f"{name} is not a saved checkpoint directory: {str(error).splitlines()[0]}") from error
        try:
            return model_class.from_pretrained(name, local_files_only=True, **kwargs)
        except OSError:
            pass
        if not hub_reachable(name):
            raise UserError(f"checkpoint {name} is not in the local Hugging Face cache and {why_no_download()}: "
                            f"connect to the internet once to download it, or pass --model with a local directory")
        return model_class.from_pretrained(name, **kwargs)
    finally:
        logging.set_verbosity(level)


# The weight files from_pretrained reads, in its order: safetensors first; some releases hold only the pickled
# pytorch_model.bin (google/vit-large-patch16-224 and google/vit-large-patch32-224-in21k on their main branch).
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def cached_weight_file(name):
    """Path of the checkpoint's weight file (model.safetensors, else pytorch_model.bin) in a local directory or the
    HF cache, else None."""
    from huggingface_hub import try_to_load_from_cache

    for file in WEIGHT_FILES:
        if os.path.isdir(name):
            path = os.path.join(name, file)
        else:
            path = try_to_load_from_cache(name, file)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None
