"""``mmgrpo demo``: run-directory checks, media files, the app over every shipped config, and real headless Chromium.

The browser tests train two tiny runs (quickstart VLM, Flow-GRPO) for a step or two, serve the demo on
127.0.0.1, drive it with selenium + the system Chromium (``/usr/bin/chromium``, ``/usr/bin/chromedriver``; the
setup script installs them), and check that base and trained outputs both appear in the page.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

gr = pytest.importorskip("gradio", reason="the demo needs the demo extra: pip install -e '.[demo]'")

from mmgrpo import samples as sample_files  # noqa: E402
from mmgrpo.cli import main  # noqa: E402
from mmgrpo.config import dump_config  # noqa: E402
from mmgrpo.demo import DemoError, Models, build_app, find_checkpoint, load_run_config, media_key  # noqa: E402
from mmgrpo.loader import load_config  # noqa: E402
from tests.test_shipped_configs import _small  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


# ------------------------------------------------------------------------------------ media files


def test_media_writes_files_by_type(tmp_path):
    frames = np.zeros((3, 16, 16, 3), dtype=np.uint8)  # [T, H, W, 3]
    frames[1] = 255
    tone = (np.sin(np.linspace(0, 200, 1600)).astype(np.float32), 16000)
    pairs = [
        ({"prompt": "a", "answer": "x", "image": Image.new("RGB", (8, 8), "red")}, "text answer"),
        ({"prompt": "b"}, Image.new("RGB", (8, 8), "blue")),
        ({"prompt": "c"}, frames),
        ({"prompt": "d"}, tone),
        ({"prompt": "e"}, {"array": tone[0], "sampling_rate": 8000}),
    ]
    records = sample_files.write_samples(tmp_path, "after", pairs, step=3)
    index = json.loads((tmp_path / "samples_after.json").read_text())
    assert index == records
    assert [r["output_kind"] for r in records] == ["text", "image", "video", "audio", "audio"]
    assert records[0]["output"] == "text answer" and records[0]["input_kind"] == "image"
    assert Image.open(tmp_path / records[1]["output"]).getpixel((0, 0)) == (0, 0, 255)
    assert Image.open(tmp_path / records[0]["input"]).getpixel((0, 0)) == (255, 0, 0)
    import av
    import soundfile

    with av.open(str(tmp_path / records[2]["output"])) as container:
        assert sum(1 for _ in container.decode(video=0)) == 3
    data, rate = soundfile.read(str(tmp_path / records[3]["output"]))
    assert rate == 16000 and len(data) == 1600
    assert soundfile.read(str(tmp_path / records[4]["output"]))[1] == 8000
    assert "PIL.Image" not in (tmp_path / "samples_after.json").read_text()
    read = sample_files.read_samples(tmp_path)["after"]
    assert Path(read[1]["output"]).is_file()


def test_media_logs_images_to_tensorboard(tmp_path):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = Accelerator(
        log_with="tensorboard", project_config=ProjectConfiguration(str(tmp_path), logging_dir=str(tmp_path / "logs"))
    )
    acc.init_trackers("t")
    tone = (np.zeros(800, dtype=np.float32), 8000)
    records = sample_files.write_samples(
        tmp_path, "after", [({"prompt": "p"}, Image.new("RGB", (8, 8))), ({"prompt": "q"}, tone)]
    )
    sample_files.log_samples(acc, "after", records, tmp_path, step=1)
    acc.end_training()
    events = EventAccumulator(str(next((tmp_path / "logs").rglob("events.*")).parent)).Reload()
    assert "samples/after/000" in events.Tags()["images"]
    assert "samples/after/001" in events.Tags()["audio"]


# ------------------------------------------------------------------------------------ run directory


def test_missing_checkpoint_gives_one_line_message(tmp_path, capsys):
    cfg = load_config(ROOT / "configs/quickstart.yaml", [f"output_dir={tmp_path}"])
    (tmp_path / "config.yaml").write_text(dump_config(cfg))
    assert main(["demo", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no checkpoint" in err and "save_final" in err
    assert main(["demo", str(tmp_path / "nowhere")]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    with pytest.raises(DemoError, match="not a complete mmgrpo checkpoint"):
        find_checkpoint(tmp_path, "step-000005")


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_app_builds_for_every_shipped_config(config, tmp_path):
    """The page is built from the config, its task's held-out rows and no family names, for every shipped config.

    No model is built here (they load on the first request; the hub recipes cannot load offline), so this proves
    the layout and wiring per config; the browser tests below prove answering for a VLM run and a flow run.
    """
    cfg = load_config(config, _small(config))  # the layout does not depend on how many rows a synthetic task makes
    app = build_app(tmp_path, Models(cfg, None), cfg)
    labels = [b.label for b in app.blocks.values() if isinstance(b, gr.Tab)]
    assert "training" in labels
    from mmgrpo.demo import _eval_rows

    rows, problem = _eval_rows(cfg)
    kind = {"image": "image", "images": "image", "video": "video", "audio": "audio"}.get(media_key(rows) or "")
    assert (f"ask ({kind})" if kind else "generate") in labels
    hub_recipe = cfg.model.args.get("name_or_path", "").count("/") > 0
    example_data = cfg.task.name == "dataset" and "examples/data/" in str(problem)  # examples/make_example_datasets.py
    assert problem is None or hub_recipe or example_data, problem  # only these lack data on a fresh clone


# ------------------------------------------------------------------------------------ browser tests


def _train(tmp_path: Path, config: str, *overrides: str) -> Path:
    out = tmp_path / Path(config).stem
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [
        sys.executable,
        "-m",
        "mmgrpo",
        "train",
        str(ROOT / config),
        f"output_dir={out}",
        "logging.progress=false",
        "checkpoint.save_final=true",
        *overrides,
    ]
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, capture_output=True, timeout=900)
    return out


def _browser(tmp_path: Path):
    webdriver = pytest.importorskip("selenium.webdriver")
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip("needs Debian chromium + chromium-driver (scripts/setup_env.sh installs them)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1400,1400",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def _wait(driver, predicate, timeout=600, what=""):
    end = time.time() + timeout
    while time.time() < end:
        try:
            value = predicate(driver)
            if value:
                return value
        except Exception:  # element not rendered yet
            pass
        time.sleep(0.5)
    raise AssertionError(
        f"timed out waiting for {what}; page text: {driver.find_element('tag name', 'body').text[:2000]}"
    )


def _serve(run_dir: Path):
    from mmgrpo.demo import serve

    app = serve(str(run_dir), block=False)
    return app, f"http://127.0.0.1:{app.server_port}/"


def _listening_addresses(port: int) -> set[str]:
    import psutil

    return {
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == "LISTEN" and c.laddr.port == port
    }


def _run_model_tab(driver, shots: Path, name: str, media_kind: str | None):
    from selenium.webdriver.common.by import By

    _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#prompt textarea").get_attribute("value"), 120, "example")
    driver.find_element(By.CSS_SELECTOR, "#run").click()
    status = _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, "#status").text.strip(), 600, "answers")
    assert status.startswith("done"), status
    for side in ("base", "trained"):
        reward = driver.find_element(By.CSS_SELECTOR, f"#{side}-reward").text
        assert reward.startswith(f"{side} greedy: reward"), reward
        if media_kind == "image":
            img = _wait(
                driver, lambda d, side=side: d.find_element(By.CSS_SELECTOR, f"#{side}-image img"), 60, f"{side} image"
            )
            assert img.get_attribute("src") and img.size["width"] > 0
        else:
            text = driver.find_element(By.CSS_SELECTOR, f"#{side}-text textarea").get_attribute("value")
            assert len(text) > 0, f"{side} answer empty"
    driver.save_screenshot(str(shots / f"{name}_model.png"))


def _run_training_tab(driver, shots: Path, name: str, gallery_min: int):
    from selenium.webdriver.common.by import By

    driver.find_element(By.XPATH, "//button[@role='tab' and contains(., 'training')]").click()
    driver.find_element(By.CSS_SELECTOR, "#refresh").click()
    table = _wait(driver, lambda d: "after" in d.find_element(By.CSS_SELECTOR, "#eval-table").text, 120, "eval table")
    assert table
    imgs = _wait(
        driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#train-gallery img")) >= gallery_min, 60, "gallery"
    )
    assert imgs
    driver.save_screenshot(str(shots / f"{name}_training.png"))


@pytest.mark.slow
def test_demo_in_chromium_vlm_run(tmp_path):
    run = _train(
        tmp_path,
        "configs/quickstart.yaml",
        "steps=2",
        "warmup.steps=2",
        "task.args.train_size=16",
        "task.args.eval_size=4",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=2",
        "algorithm.minibatch_size=4",
        "eval.every=0",
    )
    assert load_run_config(run).model.adapter == "vlm"
    app, url = _serve(run)
    driver = _browser(tmp_path)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        addresses = _listening_addresses(app.server_port)
        assert addresses == {"127.0.0.1"}, addresses  # the bound socket: loopback only
        driver.get(url)
        _run_model_tab(driver, shots, "vlm", None)
        _run_training_tab(driver, shots, "vlm", gallery_min=1)  # the held-out images the samples answer
        if os.environ.get("MMGRPO_DEMO_SCREENSHOTS"):
            shutil.copytree(shots, os.environ["MMGRPO_DEMO_SCREENSHOTS"], dirs_exist_ok=True)
    finally:
        driver.quit()
        app.close()


@pytest.mark.slow
def test_demo_in_chromium_flow_run(tmp_path):
    run = _train(
        tmp_path,
        "configs/flow_grpo.yaml",
        "steps=1",
        "algorithm.prompts_per_step=2",
        "algorithm.group_size=2",
        "algorithm.minibatch_size=4",
        "task.args.eval_seeds=1",
    )
    app, url = _serve(run)
    driver = _browser(tmp_path)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    try:
        assert _listening_addresses(app.server_port) == {"127.0.0.1"}
        probe = socket.socket()
        probe.settimeout(2)
        try:  # not reachable on the machine's other addresses
            host_ip = socket.gethostbyname(socket.gethostname())
            if not host_ip.startswith("127."):
                assert probe.connect_ex((host_ip, app.server_port)) != 0
        finally:
            probe.close()
        driver.get(url)
        _run_model_tab(driver, shots, "flow", "image")
        _run_training_tab(driver, shots, "flow", gallery_min=2)  # generated images, not strings
        if os.environ.get("MMGRPO_DEMO_SCREENSHOTS"):
            shutil.copytree(shots, os.environ["MMGRPO_DEMO_SCREENSHOTS"], dirs_exist_ok=True)
    finally:
        driver.quit()
        app.close()


def test_model_error_is_shown_in_the_page_not_raised(tmp_path):
    """The run button's handler turns a model failure into a status line; the app keeps serving."""

    class Broken(Models):
        def get(self):
            raise RuntimeError("CUDA out of memory (simulated)")

    cfg = load_config(ROOT / "configs/flow_grpo.yaml")
    app = build_app(tmp_path, Broken(cfg, None), cfg)
    handlers = [f for f in app.fns.values() if getattr(f.fn, "__name__", "") == "run"]
    assert len(handlers) == 1
    status, *updates = handlers[0].fn("0: a red circle top right", "a red circle top right", 0, 0)
    assert status.startswith("**error:** RuntimeError: CUDA out of memory (simulated)")
    from mmgrpo.demo.kinds import KINDS

    # per side: one box per kind, the reward line, the samples' text and gallery, the multi-turn trajectory
    assert len(updates) == 2 * (len(KINDS) + 4) == 16


def test_uploads_limited_in_type():
    from mmgrpo.demo import MAX_FILE_SIZE, _check_upload

    _check_upload("/tmp/x.PNG", "image")
    for path, kind in (("/tmp/x.py", "image"), ("/tmp/x.png", "audio"), ("/tmp/x.exe", "video")):
        with pytest.raises(DemoError, match="files must be one of"):
            _check_upload(path, kind)
    assert MAX_FILE_SIZE == "20mb"
