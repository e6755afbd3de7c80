"""common/pretrained.py: a checkpoint loaded by Hub id or folder, with one line when it cannot be had; what the Hub
answered; the image processor read where the checkpoint is."""
import pytest
from huggingface_hub import constants

from common import pretrained
from common.pretrained import check_model_flag, load_pretrained
from common.start_and_end import UserError
from job import downloads
from job.standins import HUB_PROCESSOR


def test_missing_checkpoint_offline_names_it_and_the_fix():
    from transformers import ViTModel

    with pytest.raises(UserError) as problem:
        load_pretrained(ViTModel, "google/vit-not-a-real-checkpoint")
    message = str(problem.value)
    assert "google/vit-not-a-real-checkpoint" in message and "--model" in message and "\n" not in message


def test_a_directory_without_a_checkpoint_is_reported(tmp_path):
    from transformers import ViTModel

    with pytest.raises(UserError, match="not a saved checkpoint directory"):
        load_pretrained(ViTModel, str(tmp_path))


def test_a_model_flag_is_a_directory_or_a_hub_id_by_the_hubs_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "weights.bin").write_bytes(b"")
    for hub_id in ("google/vit-base-patch16-224", "vit", "a/b", "models/vit"):  # not refused: the Hub is asked later
        check_model_flag(hub_id)
    for path in ("./a", str(tmp_path / "a"), "a/b/c"):
        check_model_flag(path)
    for name, what in [("./nothing", "does not exist"), ("a/b/nothing", "does not exist"),
                       ("google/vit base", "does not exist"),
                       ("./weights.bin", "is a file, not a checkpoint directory")]:
        with pytest.raises(UserError, match=rf"^--model {name}: the directory {what}; pass a saved checkpoint "
                                            rf"directory or a Hub id$"):
            check_model_flag(name)


# ---------------------------------------------------------------- the one probe: what the Hub answers, in one line

TOKEN = "answered {} when asked for checkpoint a/b: check HF_TOKEN, or log in (hf auth login)"
TROUBLE = "answered {} when asked for checkpoint a/b: the server has trouble, try again later"
PROBES = [  # (the server's fault, what ask_hub answers: (None, why) or the UserError's line)
    ({"kind": "status", "code": 401}, TOKEN.format("401 Unauthorized")),
    ({"kind": "status", "code": 403}, TOKEN.format("403 Forbidden")),
    ({"kind": "status", "code": 500}, TROUBLE.format("500 Internal Server Error")),
    ({"kind": "status", "code": 503}, TROUBLE.format("503 Service Unavailable")),
    ({"kind": "status", "code": 429}, TROUBLE.format("429 Too Many Requests")),
    ({"kind": "stall"}, (None, "did not answer within 1 s")),
]


@pytest.mark.parametrize("fault,answer", PROBES, ids=["401", "403", "500", "503", "429", "silence"])
def test_the_probe_says_what_the_hub_answered_naming_the_mirror(monkeypatch, fault, answer):
    """A token refused is the user's to fix; 429 and 5xx are the server's trouble (hub_reachable: not reachable, so
    the job plans without it); silence past HF_HUB_ETAG_TIMEOUT is a reason, not a hang."""
    from local_servers import Faulty

    server = Faulty()
    try:
        server.faults.append({"path": "/", "times": 100, **fault})
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_ETAG_TIMEOUT", 1)
        hub = f"the Hub mirror {server.url}"
        if isinstance(answer, tuple):
            assert pretrained.ask_hub("a/b") == (None, f"{hub} {answer[1]}")
        else:
            with pytest.raises(UserError) as error:
                pretrained.ask_hub("a/b")
            assert str(error.value) == f"{hub} {answer}"
            trouble = fault["code"] in (429, 500, 503)
            assert isinstance(error.value, pretrained.HubTrouble) == trouble
            if trouble:
                assert downloads.hub_reachable("a/b") is False
    finally:
        server.close()


def test_the_probe_names_a_server_that_cannot_be_reached(monkeypatch):
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert pretrained.ask_hub("a/b") == (None, "the Hub mirror http://127.0.0.1:9 cannot be reached")


def test_the_image_processor_is_read_where_the_checkpoint_is_and_never_guessed(tmp_path, monkeypatch):
    """A folder's own preprocessor_config.json, or none; the article's ids need no fetch (their processor is the
    article's pixels); another Hub id whose file is neither cached nor to be had is one line, not a guess."""
    import json

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    for folder in ("with", "without"):  # what the function reads of a checkpoint's folder
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "config.json").write_text("{}")
    (tmp_path / "with" / "preprocessor_config.json").write_text(json.dumps(HUB_PROCESSOR))
    assert pretrained.processor_config(str(tmp_path / "with")) == HUB_PROCESSOR
    assert pretrained.processor_config(str(tmp_path / "without")) is None
    assert pretrained.processor_config("google/vit-base-patch16-224-in21k") is None
    snapshot = tmp_path / "cache" / "models--google--vit-base-patch16-224" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)  # the backbone's AutoImageProcessor fetched it: the article's pixels all the same
    (snapshot / "preprocessor_config.json").write_text(json.dumps({**HUB_PROCESSOR, "image_mean": [0.0, 0.0, 0.0]}))
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("a" * 40)
    assert pretrained.processor_config("google/vit-base-patch16-224") is None
    with pytest.raises(UserError, match="so the pixels it was made for are unknown") as refused:
        pretrained.processor_config("someone/other-vit")
    assert "\n" not in str(refused.value)
    for damaged in ('{"image_mean": [0.5', "[0.5, 0.5, 0.5]"):  # cut short; JSON, but not an object
        (tmp_path / "with" / "preprocessor_config.json").write_text(damaged)
        with pytest.raises(UserError, match=r"its preprocessor_config.json is not a JSON object \("):
            pretrained.processor_config(str(tmp_path / "with"))


NESTED = {"image_processor": {**HUB_PROCESSOR, "image_mean": [0.1, 0.2, 0.3]}, "processor_class": "AProcessor"}


@pytest.mark.parametrize(("files", "read"), [
    ({"processor_config.json": NESTED}, NESTED["image_processor"]),  # transformers reads the nested entry first
    ({"processor_config.json": NESTED, "preprocessor_config.json": HUB_PROCESSOR}, NESTED["image_processor"]),
    ({"processor_config.json": {"processor_class": "AProcessor"}, "preprocessor_config.json": HUB_PROCESSOR},
     HUB_PROCESSOR),  # a nested file without an image processor: the processor file's
    ({"processor_config.json": {"processor_class": "AProcessor"}}, None),  # neither: the article's pixels
    ({"processor_config.json": {"image_processor": [0.5]}, "preprocessor_config.json": HUB_PROCESSOR},
     "the image_processor entry of its processor_config.json is not a JSON object"),
    ({"processor_config.json": '{"image_processor": {', "preprocessor_config.json": HUB_PROCESSOR},
     "its processor_config.json is not a JSON object"),
])
def test_the_image_processor_is_the_one_transformers_reads_of_the_two_files(files, read, tmp_path, monkeypatch):
    """AutoImageProcessor (transformers 5) takes processor_config.json's "image_processor" entry before
    preprocessor_config.json; so do the Part 3 scripts, from a folder and from the Hugging Face cache."""
    import json

    from transformers import AutoImageProcessor

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "cache" / "models--someone--other-vit"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("a" * 40)
    for folder in (tmp_path / "folder", repo / "snapshots" / ("a" * 40)):
        folder.mkdir(parents=True)
        for file, content in files.items():
            (folder / file).write_text(content if isinstance(content, str) else json.dumps(content))
    for name in (str(tmp_path / "folder"), "someone/other-vit"):
        if name == "someone/other-vit" and "preprocessor_config.json" not in files:
            continue  # not in the cache, offline: one line, as the test above has it
        if isinstance(read, str):
            with pytest.raises(UserError, match=read):
                pretrained.processor_config(name)
        else:
            assert pretrained.processor_config(name) == read, name
    if isinstance(read, dict):  # transformers' own reading of the folder
        assert list(AutoImageProcessor.from_pretrained(tmp_path / "folder").image_mean) == read["image_mean"]


def test_a_hub_id_whose_processor_file_is_not_cached_has_each_file_the_hub_lists_fetched(tmp_path, monkeypatch):
    """Neither file in the cache: the Hub's list of files says which exist, and those are downloaded (both here)."""
    import json
    from types import SimpleNamespace

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    listed = [SimpleNamespace(rfilename=file) for file in ("config.json", "processor_config.json",
                                                           "preprocessor_config.json")]
    monkeypatch.setattr(pretrained, "ask_hub", lambda name: (SimpleNamespace(siblings=listed), None))
    fetched = []

    def download(name, file):
        fetched.append(file)
        path = tmp_path / file
        path.write_text(json.dumps(NESTED if file == "processor_config.json" else HUB_PROCESSOR))
        return str(path)

    monkeypatch.setattr(pretrained, "hub_download", download)
    assert pretrained.processor_config("someone/other-vit") == NESTED["image_processor"]
    assert sorted(fetched) == ["preprocessor_config.json", "processor_config.json"]


def test_a_folder_whose_image_processor_crops_is_refused_as_the_model_flag(tmp_path):
    import json

    (tmp_path / "crop").mkdir()
    (tmp_path / "crop" / "preprocessor_config.json").write_text(json.dumps({**HUB_PROCESSOR, "do_center_crop": True}))
    with pytest.raises(UserError, match="its image processor crops the picture"):
        check_model_flag(str(tmp_path / "crop"))


def test_a_hub_download_error_shows_no_secret_of_hf_endpoint(monkeypatch):
    """The HTTP client's words repeat the URL it asked, HF_ENDPOINT's user:password and query in it."""
    monkeypatch.setattr(constants, "ENDPOINT", "http://user:SECRET@127.0.0.1:9/hub?token=SECRET")
    error = RuntimeError("Client error '404 Not Found' for url 'http://user:SECRET@127.0.0.1:9/hub/a/b/config.json'")
    assert pretrained.download_error(error) == ("Client error '404 Not Found' for url "
                                                "'http://***@127.0.0.1:9/hub/a/b/config.json'")
