"""Statistics of one model never meet another model's weights: every view, the dashboard and the
command line refuse the pair at construction, with the error and message ``convert()`` gives."""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget import notebook, views
from headwidget.analysis.conversions import convert
from headwidget.cli import main
from headwidget.errors import StatsMismatchError
from headwidget.views import view_class, view_names
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    gpt2 = make_model("gpt2", dtype=torch.float32)
    llama = make_model("llama_mha", dtype=torch.float32)  # same head count and layers as the GPT-2
    # Saved first, as a downloaded model is: saving fills in the config's architectures and dtype.
    folder = tmp_path_factory.mktemp("gpt2")
    gpt2.save_pretrained(folder)
    capture = {"inputs": True, "cross_layer": True, "progress": False}
    return {
        "gpt2": gpt2,
        "gpt2_dir": folder,
        "llama": llama,
        "gpt2_stats": headwidget.capture(gpt2, ragged_batches(), **capture),
        "llama_stats": headwidget.capture(llama, ragged_batches(), **capture),
    }


@pytest.fixture(scope="module")
def refusal(models) -> str:
    """The message of convert()'s refusal: every face must give this one."""
    with pytest.raises(StatsMismatchError) as info:
        convert(models["gpt2"], 0, "mha", models["llama_stats"])
    return str(info.value)


def test_the_pair_really_is_foreign(models):
    # Same number of heads and layers: only the metadata tells the pair apart, nothing fails by itself.
    gpt2, llama = models["gpt2_stats"].meta.layout, models["llama_stats"].meta.layout
    assert (gpt2.num_heads, gpt2.num_layers) == (llama.num_heads, llama.num_layers)
    assert models["gpt2_stats"].meta.model_class != models["llama_stats"].meta.model_class


# Views built from statistics as a plain capture leaves them (not a report, a timeline or healing runs; no
# token samples)
FROM_STATS = [n for n in view_names() if view_class(n).sources.main in ("stats", "model")]


@pytest.mark.parametrize("shown", [False, True])
@pytest.mark.parametrize("name", [n for n in FROM_STATS if n != "quantization"])
def test_every_registered_view_refuses_another_models_statistics(models, refusal, name, shown):
    cls = view_class(name)
    with pytest.raises(StatsMismatchError) as info:
        cls.create(models["llama_stats"], models["gpt2"], layers=[0])
    assert str(info.value) == refusal
    # The model the statistics come from is accepted.
    view = cls.create(models["gpt2_stats"], models["gpt2"], layers=[0], interactive=False)
    grid = view.grid
    assert view.error == "" and (grid.panels or grid.charts)  # (the trends draw charts only)
    if shown:
        assert view.widget.error == "" and len(view.widget.panels) == len(grid.panels)
        assert len(view.widget.charts) == len(grid.charts)
    view.close()


def test_mechanism_view_refuses_at_construction(models, refusal):
    cls = views.MechanismView
    with pytest.raises(StatsMismatchError) as info:
        cls(models["gpt2"], stats=models["llama_stats"])
    assert str(info.value) == refusal
    with pytest.raises(StatsMismatchError, match=r"^model 'gpt2': these statistics were captured from Llama"):
        cls({"llama": models["llama"], "gpt2": models["gpt2"]}, stats=models["llama_stats"])
    own = cls(models["gpt2"], stats=models["gpt2_stats"], mechanisms=["mqa"])
    # data-aware: the error is weighted by the captured inputs, as convert() with the right stats gives
    expected = convert(models["gpt2"], 0, "mqa", models["gpt2_stats"]).reconstruction_error["key"]
    assert f"err K {expected:.3f}" in own.grid.panels[0].subtitle


def test_dashboard_refuses_before_building_a_tab(models, refusal, monkeypatch):
    built: list[str] = []
    real = notebook._explore.view_class
    monkeypatch.setattr(notebook._explore, "view_class", lambda name: built.append(name) or real(name))
    with pytest.raises(StatsMismatchError) as info:
        notebook.Dashboard(models["llama_stats"], models["gpt2"])
    assert str(info.value) == refusal and built == []
    dash = notebook.Dashboard(models["gpt2_stats"], models["gpt2"])
    assert dash.mechanisms is not None and dash.mechanisms.stats is models["gpt2_stats"]
    assert notebook.explore(models["llama_stats"]).mechanisms is None  # statistics alone: no weights


def test_command_line_figure_refuses_another_models_statistics(models, refusal, tmp_path, capsys):
    foreign = models["llama_stats"].save(tmp_path / "llama.safetensors")
    own = models["gpt2_stats"].save(tmp_path / "gpt2.safetensors")
    out = tmp_path / "mechanisms.png"
    args = ["--view", "mechanisms", "--model", str(models["gpt2_dir"]), "--out", str(out)]
    capsys.readouterr()
    assert main(["figure", str(foreign), *args]) == 1
    err = capsys.readouterr().err
    assert err == f"headwidget figure: {refusal}\n" and not out.exists()
    # Statistics captured in Python from the model that was saved: the saved class is loaded back.
    assert main(["figure", str(own), *args]) == 0, capsys.readouterr().err
    assert out.read_bytes().startswith(b"\x89PNG")


def test_saving_or_casting_the_model_keeps_its_statistics(tmp_path) -> None:
    """save_pretrained writes ``architectures`` and ``dtype`` into the config: still the same model."""
    model = make_model("llama_mha", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), inputs=True, progress=False)
    model.save_pretrained(tmp_path)
    assert model.config.architectures == ["LlamaForCausalLM"]
    fitted = convert(model, 0, "lrkv:2", stats)  # data-aware: refused before the fix
    assert fitted.reconstruction_error["key"] >= 0
    reloaded = type(model).from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert convert(reloaded, 0, "lrkv:2", stats).reconstruction_error["key"] >= 0


def test_statistics_written_before_the_fingerprint_ignored_storage_fields_still_match() -> None:
    from headwidget.stats._meta import _fingerprint, config_matches

    model = make_model("llama_mha", dtype=torch.float32)
    legacy = _fingerprint(model.config, ("transformers_version",))
    assert config_matches(legacy, model.config)
    assert not config_matches(legacy, make_model("llama_gqa", dtype=torch.float32).config)
