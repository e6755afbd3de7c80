"""Pretrained ViT checkpoints: Table 1's sizes as a config; loading by id or folder, quietly, one line when one
cannot be had; their image processor and its pixels; a fine-tuned one saved as from_pretrained loads it."""
import contextlib
import json
import os
import pickle
import reprlib
import urllib.parse
from pathlib import Path

import numpy as np
from huggingface_hub import HfApi, constants, hf_hub_download, is_offline_mode, try_to_load_from_cache
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, StrictDataclassError
from huggingface_hub.utils import HFValidationError, set_client_factory, validate_repo_id
from huggingface_hub.utils import logging as hub_logging
from huggingface_hub.utils._http import default_client_factory
from PIL import Image
from safetensors import SafetensorError
from tqdm import tqdm

# transformers is imported where it is used: a DataLoader worker (spawn) imports this module again, 3 s more each
from common.files import reason, write_folder_atomic
from common.start_and_end import UserError

HUB_ENDPOINT = "https://huggingface.co"


class HubTrouble(UserError):
    """The Hub (or its mirror) answered an error status, 429 or 5xx: a passing trouble of the server."""


class DownloadError(Exception):
    """The network failed while a file was being fetched (not the disk): why, in the user's words."""


def hub_name():
    """The Hugging Face Hub, or the mirror HF_ENDPOINT names: every line about a download names the server it asks."""
    endpoint = constants.ENDPOINT
    return "the Hugging Face Hub" if endpoint == HUB_ENDPOINT else f"the Hub mirror {shown_url(endpoint)}"


def shown_url(url):
    """url as lines and records show it: a user:password and a query string (a signature) replaced by ***."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # a malformed host ("http://[::1"): nothing of it is shown
        return "(a URL that cannot be read)"
    _, at, host = parts.netloc.rpartition("@")
    return urllib.parse.urlunsplit((parts.scheme, "***@" * bool(at) + host, parts.path, "***" * bool(parts.query),
                                    parts.fragment))


def without_secrets(text, url):
    """text with url's user:password and query string replaced by ***, wherever a library's message repeats them."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return text
    for secret in sorted({parts.netloc.rpartition("@")[0], parts.password, parts.query} - {"", None}, key=len)[::-1]:
        text = text.replace(secret, "***")
    return text


def refuse_paths(answer):
    """httpx hook on the Hub's answers: the library names files in its cache after a HEAD answer's ETag and
    X-Repo-Commit and a repository's sha, unchecked, so that a hostile mirror's "../x" would lead out of it."""
    names = {"X-Repo-Commit": answer.headers.get("X-Repo-Commit")}
    if answer.request.method == "HEAD":  # the ETag the library reads, as it reads it
        etag = "X-Linked-Etag" if answer.headers.get("X-Linked-Etag") else "ETag"
        names[etag] = answer.headers.get(etag, "").lstrip("W/").strip('"')
    elif "/api/" in answer.request.url.path and "json" in answer.headers.get("Content-Type", ""):
        answer.read()  # a repository's description: its sha names its snapshot's folder
        with contextlib.suppress(ValueError):
            body = answer.json()
            names["sha"] = body.get("sha") if isinstance(body, dict) else None
    for header, name in names.items():
        if isinstance(name, str) and (os.path.isabs(name) or ".." in Path(name).parts or "\\" in name):
            raise UserError(f"{hub_name()} gave {shown_url(str(answer.request.url))} the {header} "
                            f"{reprlib.repr(name)}, a path where a Hub gives a hash: refused, as a server that is not "
                            f"a Hub or a hostile one: check HF_ENDPOINT")


def checked_client():
    client = default_client_factory()  # the library's own (offline mode, request ids), its answers' names checked
    client.event_hooks["response"].append(refuse_paths)
    return client


set_client_factory(checked_client)
hub_logging.set_verbosity_error()  # its warnings repeat HF_ENDPOINT, secret and all, at each retry: ours is one line


def ask_hub(name, repo_type="model"):
    """(its repo_info, None) when name can be downloaded now, else (None, why not): HF_HUB_OFFLINE is not set and the
    Hub (or its mirror) answers within HF_HUB_ETAG_TIMEOUT s, no retries; an unknown name or an error status is a
    UserError naming it."""
    if is_offline_mode():
        return None, "HF_HUB_OFFLINE=1 forbids downloads"
    what = "dataset" if repo_type == "dataset" else "checkpoint"
    hub, seconds = hub_name(), constants.HF_HUB_ETAG_TIMEOUT
    try:
        return HfApi().repo_info(name, repo_type=repo_type, timeout=seconds), None
    except UserError:  # refuse_paths': a hostile answer, not one that cannot be had
        raise
    except GatedRepoError as error:  # a RepositoryNotFoundError too: said first
        raise UserError(f"{what} {name} is gated on {hub}: accept its terms on its page and log in "
                        f"(hf auth login)") from error
    except RepositoryNotFoundError as error:
        raise UserError(f"{what} {name} does not exist on {hub}; check the name") from error
    except HfHubHTTPError as error:
        status = getattr(error.response, "status_code", None)
        answer = f"{hub} answered {status} {error.response.reason_phrase}" if status else f"{hub} answered an error"
        if status in (401, 403):  # a token that is wrong or has expired
            raise UserError(f"{answer} when asked for {what} {name}: check HF_TOKEN, or log in (hf auth "
                            f"login)") from error
        raise HubTrouble(f"{answer} when asked for {what} {name}: the server has trouble, try again later") from error
    except Exception as error:  # noqa: BLE001 - any other failure to reach the Hub means: do not try to download
        if "Timeout" in type(error).__name__:  # the HTTP client's (httpx's ReadTimeout, ConnectTimeout, ...)
            return None, f"{hub} did not answer within {seconds:g} s"
        return None, f"{hub} cannot be reached"


def hub_download(name, file, repo_type="model"):
    """file of name into the Hugging Face cache, its path, with tqdm's bar; a failure after the retries is one line."""
    try:
        return hf_hub_download(name, file, repo_type=repo_type, tqdm_class=tqdm)  # the library's bar hides in a pipe
    except UserError:
        raise
    except Exception as error:  # the library's and its HTTP client's errors alike, said in one line
        raise UserError(f"{'dataset' if repo_type == 'dataset' else 'checkpoint'} {name}: downloading {file} from "
                        f"{hub_name()} failed ({download_error(error)}): run again") from error


def check_model_flag(name):
    """--model must be a checkpoint directory (with an image processor the scripts can follow, if any), or else a
    name the Hub's own rule takes as a repository id: the name (argparse's type of --model)."""
    if not name.strip():
        raise UserError("--model is empty: pass a saved checkpoint directory or a Hub id")
    if os.path.isdir(os.path.expanduser(name)):
        if any("\udc80" <= char <= "\udcff" for char in name):  # undecodable bytes: safetensors opens UTF-8 only
            raise UserError(f"--model {name!r}: its path has a byte that is not UTF-8 text (safetensors): rename it")
        checkpoint_pixels(name)  # an image processor the scripts cannot follow: refused now
        return name
    try:
        validate_repo_id(name)
    except HFValidationError:
        what = "is a file, not a checkpoint directory" if os.path.exists(name) else "does not exist"
        raise UserError(f"--model {name}: the directory {what}; pass a saved checkpoint directory "
                        "or a Hub id") from None
    return name


def checkpoint_config(name):
    """The checkpoint's config on disk (a folder or the cache; no weights read), else None; a bad one is one line."""
    from transformers import AutoConfig

    check_model_flag(name)
    try:
        config = AutoConfig.from_pretrained(os.path.expanduser(name), local_files_only=True)
    except (OSError, ValueError):
        return None
    except MISBUILT as error:
        raise UserError(f"checkpoint {name}: its config.json describes no model the library can build "
                        f"({type(error).__name__}: {reason(error)})") from None
    sides = {field: getattr(config, field) for field in ("image_size", "patch_size") if hasattr(config, field)}
    if any(type(side) is not int or side < 1 for side in sides.values()):  # a square picture, cut into square patches
        raise UserError(f"checkpoint {name}: its config's {' and '.join(f'{k} {v!r}' for k, v in sides.items())}: "
                        f"each must be a whole number of pixels, at least 1: pass a checkpoint save_pretrained wrote")
    return config


MISBUILT = (TypeError, KeyError, ZeroDivisionError, StrictDataclassError)  # a config.json no model is built from


LOCAL_COPY = "connect to the internet once to download it, or pass --model with a local directory"
# a file not whole: weights (safetensors', torch.load's errors), a config that is not JSON (under transformers' OSError)
DAMAGED = (SafetensorError, pickle.UnpicklingError, EOFError, json.JSONDecodeError, UnicodeDecodeError)


def damage(error):
    """A damaged file's error in a few words (safetensors' own, else its type: torch's words would advise
    weights_only=False, which runs the file's code), or None: the error is not of a damaged file."""
    error = error.__context__ if isinstance(error, OSError) else error
    if isinstance(error, DAMAGED):
        return reason(error) if isinstance(error, SafetensorError) else type(error).__name__
    return None


def load_pretrained(model_class, name, fix=LOCAL_COPY, **kwargs):
    """model_class.from_pretrained(name) from a folder, else from_the_hub(), the library's notes silenced; a folder
    that is no checkpoint, or whose weights cannot be read, is one line."""
    from transformers.utils import logging

    check_model_flag(name)
    name, level = os.path.expanduser(name), logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        if os.path.isdir(name):
            if not os.path.isfile(os.path.join(name, "config.json")):  # the library's own words would mislead
                raise UserError(f"{name} is not a saved checkpoint directory: it has no config.json")
            try:
                return model_class.from_pretrained(name, **kwargs)
            except DAMAGED as error:
                raise UserError(f"{name} is not a saved checkpoint directory: its weight file cannot be read "
                                f"({damage(error)})") from error
            except (OSError, ValueError, RuntimeError, RecursionError) as error:  # RuntimeError: sizes that misfit
                raise UserError(f"{name} is not a saved checkpoint directory: {reason(error)}") from error
        return from_the_hub(model_class, name, fix, **kwargs)
    except MISBUILT as error:
        raise UserError(f"checkpoint {name}: its config.json describes no model the library can build "
                        f"({type(error).__name__}: {reason(error)})") from error
    finally:
        logging.set_verbosity(level)


def from_the_hub(model_class, name, fix, **kwargs):
    """load_pretrained's model_class.from_pretrained(name) from the Hugging Face cache, else downloaded with a bar when
    the Hub answers (ask_hub); fix: what the line on a checkpoint neither cached nor to be downloaded tells to do."""
    try:
        return model_class.from_pretrained(name, local_files_only=True, **kwargs)
    except (*DAMAGED, OSError) as error:  # not in the cache (OSError), or a file there cut short or overwritten
        if damage(error):
            raise UserError(f"checkpoint {name} in the Hugging Face cache cannot be read ({damage(error)}): delete "
                            f"it (hf cache delete) to download it again") from error
    info, why = ask_hub(name)
    if info is None:
        raise UserError(f"checkpoint {name} is not in the local Hugging Face cache and {why}: {fix}")
    files = {sibling.rfilename for sibling in info.siblings or []}
    if weights := next((file for file in WEIGHT_FILES if file in files), None):  # with a bar; then from the cache
        hub_download(name, weights)
    try:
        return model_class.from_pretrained(name, **kwargs)
    except (*DAMAGED, OSError) as error:  # OSError: the library's retries spent (a dropped line, a status, silence)
        if damage(error):
            raise UserError(f"checkpoint {name} from {hub_name()} cannot be read ({damage(error)}): delete it (hf "
                            f"cache delete) to download it again") from error
        raise UserError(f"checkpoint {name}: the download from {hub_name()} failed ({download_error(error)}): "
                        f"run again") from error


# An image processor's files: AutoImageProcessor reads an "image_processor" entry of the nested one first
PROCESSOR_FILE, NESTED_PROCESSOR_FILE = "preprocessor_config.json", "processor_config.json"
# The articles' Part 3 checkpoints, whose PROCESSOR_FILE makes ARTICLE_PIXELS (bilinear, mean and std 0.5): not read
ARTICLE_PROCESSORS = ("google/vit-base-patch16-224", "google/vit-base-patch16-224-in21k")


def processor_config(name):
    """The checkpoint's image processor (image_processor_of), from its folder or hub_processor_config; None: none."""
    folder = Path(os.path.expanduser(name))
    if not folder.is_dir():
        return hub_processor_config(name)
    return image_processor_of({file: folder / file for file in (NESTED_PROCESSOR_FILE, PROCESSOR_FILE)}, name)


def hub_processor_config(name):
    """A Hub id's image processor (image_processor_of its files) from the cache or the Hub, or None (it has none, or is
    one of ARTICLE_PROCESSORS, whatever the cache holds); one whose files cannot be had is one line: its pixels
    unknown. The Hub is asked when PROCESSOR_FILE is neither cached nor known to be missing."""
    if name in ARTICLE_PROCESSORS:  # the same pixels in every run, whether or not another script fetched its file
        return None
    cached = {file: try_to_load_from_cache(name, file) for file in (NESTED_PROCESSOR_FILE, PROCESSOR_FILE)}
    if cached[PROCESSOR_FILE] is None:  # a str: cached; another value: the Hub said it has none
        info, why = ask_hub(name)
        if info is None:
            raise UserError(f"checkpoint {name}: its image processor ({PROCESSOR_FILE}) is not in the local Hugging "
                            f"Face cache and {why}, so the pixels it was made for are unknown: {LOCAL_COPY}")
        listed = {sibling.rfilename for sibling in info.siblings or []}
        cached = {file: hub_download(name, file) if file in listed else None for file in cached}
    return image_processor_of(cached, name)


def image_processor_of(paths, name):
    """What transformers reads of a checkpoint's processor files ({file: path, or not one}): NESTED_PROCESSOR_FILE's
    "image_processor" entry, else PROCESSOR_FILE, else None; a nested entry that is no JSON object is one line."""
    read = {file: read_processor(path, name) for file, path in paths.items() if isinstance(path, (str, Path))
            and os.path.isfile(path)}
    found = read.get(NESTED_PROCESSOR_FILE, {}).get("image_processor", read.get(PROCESSOR_FILE))
    if found is not None and not isinstance(found, dict):
        raise UserError(f"--model {name}: the image_processor entry of its {NESTED_PROCESSOR_FILE} is not a JSON "
                        f"object: pass a checkpoint whose image processor can be read")
    return found


def read_processor(path, name):
    """An image processor's file as a dict; one that is not a JSON object is one line, its pixels never guessed."""
    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: arrays nested thousands deep
        found = f"{type(error).__name__}: {reason(error)}"
    if not isinstance(found, dict):
        raise UserError(f"--model {name}: its {Path(path).name} is not a JSON object ({found}): pass a checkpoint "
                        f"whose image processor can be read")
    return found


def checkpoint_pixels(name):
    """The pixels the checkpoint's image processor makes: processor_pixels of its processor_config."""
    return processor_pixels(processor_config(name), name)


def save_loadable(folder, model, names, processor, what="model"):
    """A classifier as from_pretrained and pipeline("image-classification") load it, written whole or not at all: its
    weights, config with the classes named (id2label), and the image processor that makes its pixels."""
    model.config.update({"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}})

    def write(temporary):
        model.save_pretrained(temporary)
        processor.save_pretrained(temporary)

    return write_folder_atomic(folder, write, what=what)


def download_error(error):
    """The first line of the innermost error of a failed download (the network's own words, not the library's guess
    at its cause), HF_ENDPOINT's user:password and query as ***."""
    for _ in range(20):  # a chain of causes is short; a loop in it ends here, the innermost kept once reached
        error = error.__cause__ or error.__context__ or error
    return without_secrets((str(error).splitlines() or [type(error).__name__])[0][:200], constants.ENDPOINT)


# from_pretrained's weight files, in its order; google/vit-large-patch16-224 and -patch32-224-in21k hold only the second
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def cached_weight_file(name):
    """Path of the checkpoint's weight file (WEIGHT_FILES' first) in a local directory or the HF cache, else None."""
    for file in WEIGHT_FILES:
        path = os.path.join(name, file) if os.path.isdir(name) else try_to_load_from_cache(name, file)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None


# the article's checkpoints' image processor (ViTImageProcessor): bilinear, then (x/255 - 0.5) / 0.5
ARTICLE_PIXELS = {"resample": Image.BILINEAR, "mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5)}
RESAMPLES = {Image.NEAREST, Image.BILINEAR, Image.BICUBIC, Image.LANCZOS, Image.BOX, Image.HAMMING}  # PIL's filters


def processor_pixels(config, name):
    """{"resample", "mean", "std"} of the pixels --model `name`'s image processor makes (config: its
    preprocessor_config.json, or None: the article's); one that crops, does not resize or rescales otherwise is
    refused in one line, not followed halfway."""
    if config is None:
        return ARTICLE_PIXELS
    try:
        return followed_pixels(config, name)
    except (TypeError, ValueError) as error:  # a value of another type: null, a list where a number goes
        raise UserError(f"--model {name}: its image processor has a value of the wrong type ({error}): pass a "
                        f"checkpoint whose preprocessor_config.json is as transformers writes it") from None


def followed_pixels(config, name):
    """processor_pixels of a preprocessor_config.json."""
    resample = config.get("resample", Image.BILINEAR)  # a filter's number: 2.0 would reach PIL, which refuses it
    otherwise = [what for what, does in (
        ("crops the picture (do_center_crop)", config.get("do_center_crop")),
        ("does not resize it (do_resize false)", config.get("do_resize", True) is False),
        ("does not rescale by 1/255", config.get("do_rescale", True) is False
         or abs(config.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-12),
        (f"resamples with filter {reprlib.repr(config.get('resample'))}, not one of PIL's",
         resample not in RESAMPLES or not isinstance(resample, int)),
    ) if does]
    if otherwise:
        raise UserError(f"--model {name}: its image processor {otherwise[0]}, which the scripts do not follow (they "
                        f"resize the whole picture to R x R and scale it by 1/255): pass a checkpoint whose processor "
                        f"does so")
    if not config.get("do_normalize", True):
        return {"resample": resample, "mean": (0.0, 0.0, 0.0), "std": (1.0, 1.0, 1.0)}
    stats = {what: np.ravel(config.get(f"image_{what}", ARTICLE_PIXELS[what])) for what in ("mean", "std")}
    if any(len(value) not in (1, 3) or not np.all(np.isfinite(value)) for value in stats.values()) \
            or not np.all(stats["std"] > 0):
        shown = {what: value.tolist() if len(value) <= 3 else f"of {len(value):,} values"
                 for what, value in stats.items()}
        raise UserError(f"--model {name}: its image processor's image_mean {shown['mean']} and image_std "
                        f"{shown['std']} are not one finite value, or one a channel, with std above 0: "
                        f"pass a checkpoint whose processor has them")
    return {"resample": resample, **{what: tuple(map(float, np.broadcast_to(v, 3))) for what, v in stats.items()}}


# Table 1 of the paper: layers, hidden size D, MLP size, heads.
VIT_SIZES = {"B": (12, 768, 3072, 12), "L": (24, 1024, 4096, 16), "H": (32, 1280, 5120, 16)}


def table1_config(size, patch, image_size=224, **fields):
    """A transformers ViTConfig of a Table 1 size (fields: any other of its fields, num_labels=1000)."""
    from transformers import ViTConfig

    layers, width, mlp, heads = VIT_SIZES[size]
    return ViTConfig(hidden_size=width, num_hidden_layers=layers, intermediate_size=mlp,
                     num_attention_heads=heads, patch_size=patch, image_size=image_size, **fields)
