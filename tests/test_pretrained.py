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
