"""The Gradio page: :func:`build_app` builds the Blocks; nothing is loaded or launched at import."""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any, Iterator

from ..extras import require
from ..methods import get_method
from ..models import DEFAULT_MODEL, REGISTRY
from .cache import ModelCache, describe_device
from .examples import EXAMPLES
from .highlight import LEGEND_HTML, PANE_CSS, render_pane
from .plots import comparison_figure
from .request import (
    MAX_PANES,
    MAX_SEED,
    TEMPERATURE_RANGE,
    AppError,
    OptionSlot,
    Sources,
    check_exposure,
    identifier,
    option_slots,
    parse_request,
    selectable_methods,
)
from .session import Comparison
from .streaming import MethodTrace, describe_error

gr = require("gradio", "app", "The demo app")

logger = logging.getLogger(__name__)

INTRO_HTML = """\
<h1>⚡ hf_speculative: speculative decoding, side by side</h1>
<p>Plain greedy decoding runs first, then each method you pick, on the same model and prompt. Every output
streams live; <span class="hfs-draft">highlighted</span> text came from drafts the target accepted, the rest
the target produced itself (one token per target forward). Under greedy decoding every method must give
exactly greedy's text: the badge under each pane says whether it did.</p>
"""


def build_app(
    cache: ModelCache | None = None,
    *,
    default_model: str = DEFAULT_MODEL,
    default_methods: list[str] | None = None,
    max_queue: int = 16,
    concurrency_limit: int | None = None,
    max_prompt_tokens: int = 2048,
    max_new_tokens_limit: int = 512,
    default_max_new_tokens: int = 128,
    allow_local_paths: bool = False,
) -> gr.Blocks:
    """Build the demo's Blocks (models load on the first request, not here).

    Visitors pick the model, draft models, EAGLE drafters and exit adapters from lists: the registry's
    models and ``default_model``, the shipped drafters. Every value the ``/compare`` API receives is
    checked on the server (:func:`~hf_speculative.app.request.parse_request`).

    Args:
        cache (`ModelCache`, *optional*): shared model cache (a fresh one on the default device if omitted).
        default_model (`str`): model selected when the page opens (registry name or local folder); the
            operator's choice, so it is offered even when it is a folder.
        default_methods (`list[str]`, *optional*): methods ticked when the page opens.
        max_queue (`int`): requests waiting at most; later visitors are told the queue is full.
        concurrency_limit (`int`, *optional*): comparisons running at once (default: 1 on CPU, where
            two would distort each other's timings, 2 on a GPU).
        max_prompt_tokens (`int`): longest prompt accepted, chat template included.
        max_new_tokens_limit (`int`): upper bound of the "max new tokens" slider.
        default_max_new_tokens (`int`): its initial value.
        allow_local_paths (`bool`): let visitors also type any local folder or Hub id (``app.py
            --allow-local-paths``), for a local run only: refused on a Space (``SPACE_ID``), and
            ``launch()`` refuses a host beyond localhost or a share link.

    Returns:
        `gr.Blocks` with its queue configured; call ``.launch()`` on it.

    Raises:
        ValueError: ``allow_local_paths`` on a Space.
    """
    check_exposure(allow_local_paths)
    cache = cache or ModelCache()
    sources = Sources.offered(default_model, allow_local_paths=allow_local_paths)
    on_gpu = cache.device.type == "cuda"
    slots = option_slots()
    choices = selectable_methods()
    ticked = [m for m in (default_methods or ["prompt-lookup", "hf-prompt-lookup"]) if m in choices] or choices[:1]

    # analytics off: no calls home from a demo that may run offline or on a visitor-facing Space
    with gr.Blocks(title="hf_speculative: speculative decoding demo", analytics_enabled=False) as demo:
        gr.HTML(INTRO_HTML, css_template=PANE_CSS)
        gr.Markdown(f"**Device:** {describe_device(cache.device)} · {_versions()}", elem_id="hfs-device")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=10, placeholder="Type a prompt or pick an example below",
                                    elem_id="hfs-prompt")
                gr.Examples(examples=[[text] for text in EXAMPLES.values()], inputs=[prompt],
                            example_labels=list(EXAMPLES), label="Examples")
            with gr.Column(scale=2):
                model = gr.Dropdown(choices=list(sources.models), value=default_model,
                                    allow_custom_value=allow_local_paths, label="Model",
                                    info="registry name, local folder or Hub id" if allow_local_paths else
                                    "models offered by this app", elem_id="hfs-model")
                methods = gr.CheckboxGroup(choices=[(get_method(m).label, m) for m in choices], value=ticked,
                                           label=f"Methods (greedy always runs first; up to {MAX_PANES - 1})",
                                           elem_id="hfs-methods")
                max_new = gr.Slider(1, max_new_tokens_limit, value=default_max_new_tokens, step=1,
                                    label="Max new tokens")
                with gr.Row():
                    sampling = gr.Checkbox(value=False, label="Sample (else greedy)")
                    temperature = gr.Slider(*TEMPERATURE_RANGE, value=0.7, step=0.05, label="Temperature")
                    seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed")
                concurrent = gr.Checkbox(value=False, interactive=on_gpu, label="Run methods at the same time",
                                         info="GPU only; on CPU methods run one after another for fair timings")
        option_inputs = _option_inputs(slots, sources)
        with gr.Row():
            run_btn = gr.Button("Generate and compare", variant="primary", elem_id="hfs-run")
            stop_btn = gr.Button("Stop", variant="stop", elem_id="hfs-stop")
        status = gr.Markdown("Ready.", elem_id="hfs-status")
        gr.HTML(LEGEND_HTML, css_template=PANE_CSS)
        with gr.Row(equal_height=False):
            panes = [gr.HTML(visible=False, css_template=PANE_CSS, elem_id=f"hfs-pane-{i}") for i in range(MAX_PANES)]
        plot = gr.Plot(label="Tokens over time and accepted length per step", elem_id="hfs-plot")
        with gr.Accordion("Raw results (JSON)", open=False):
            results = gr.JSON(label="results", elem_id="hfs-results")

        def compare(prompt, model, methods, max_new_tokens, sample, temperature, seed, concurrent,
                    *option_values) -> Iterator[tuple]:
            yield from _run_comparison(
                cache, slots, default_model, max_new_tokens_limit, max_prompt_tokens,
                (prompt, model, methods, max_new_tokens, sample, temperature, seed, concurrent, list(option_values)),
                sources=sources, on_gpu=on_gpu,
            )

        compare.__signature__ = _api_signature(compare, slots)  # named API parameters for the options

        event = run_btn.click(
            compare,
            inputs=[prompt, model, methods, max_new, sampling, temperature, seed, concurrent, *option_inputs],
            outputs=[status, *panes, plot, results],
            api_name="compare",
            # the handler gets the values as sent and checks every one (parse_request): a client of the API
            # gets the app's own messages, not the components' checks (some of which raise on NaN or text)
            preprocess=False,
        )
        stop_btn.click(None, cancels=[event])
    demo.queue(max_size=max_queue, default_concurrency_limit=concurrency_limit or (2 if on_gpu else 1))
    if allow_local_paths:
        _guard_launch(demo)
    return demo


def _guard_launch(demo: gr.Blocks) -> None:
    """Make ``demo.launch()`` refuse a host beyond localhost or a share link (``allow_local_paths``)."""
    launch = demo.launch

    def guarded_launch(*args: Any, **kwargs: Any) -> Any:
        check_exposure(True, kwargs.get("server_name"), bool(kwargs.get("share")))
        return launch(*args, **kwargs)

    demo.launch = guarded_launch


def _api_signature(fn: Any, slots: list[OptionSlot]) -> inspect.Signature:
    """``fn``'s signature with ``*option_values`` spelled out as ``<method>__<option>`` parameters, so that
    API clients (gradio_client) see one named parameter per method option."""
    fixed = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_POSITIONAL]
    names = [_identifier(f"{slot.method}__{slot.key}") for slot in slots]
    extra = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=s.default) for n, s in zip(names, slots)]
    return inspect.Signature(fixed + extra)


_identifier = identifier  # a method option's API parameter name


def _versions() -> str:
    import torch
    import transformers

    return f"torch {torch.__version__} · transformers {transformers.__version__} · gradio {gr.__version__}"


def _option_inputs(slots: list[OptionSlot], sources: Sources) -> list[gr.components.Component]:
    """One input per method option, grouped by method in an accordion."""
    inputs = []
    with gr.Accordion("Method options", open=False):
        for name in dict.fromkeys(slot.method for slot in slots):
            spec = get_method(name)
            gr.Markdown(f"**{spec.label}**: {spec.description}")
            with gr.Row():
                for slot in (s for s in slots if s.method == name):
                    inputs.append(_option_input(slot, sources))
    return inputs


def _option_input(slot: OptionSlot, sources: Sources) -> gr.components.Component:
    label, info = f"{slot.key}", slot.help or None
    if slot.widget in ("model", "drafter"):
        return gr.Dropdown(choices=list(sources.for_key(slot.key)), value=slot.default,
                           allow_custom_value=sources.allow_local_paths, label=label, info=info)
    if slot.widget in ("integer", "number"):
        return gr.Number(value=slot.default, precision=0 if slot.widget == "integer" else None, label=label, info=info)
    if slot.widget == "bool":
        return gr.Checkbox(value=bool(slot.default), label=label, info=info)
    return gr.Textbox(value=None if slot.default is None else str(slot.default), label=label, info=info)


# -- one request ---------------------------------------------------------------------------------
def _run_comparison(cache, slots, default_model, max_new_limit, max_prompt_tokens, form, *,
                    sources: Sources | None = None, on_gpu: bool = False) -> Iterator[tuple]:
    """The event handler's body: validate, load, run, and yield the page's outputs as they change."""
    *values, option_values = form
    try:
        request = parse_request(*values, option_values, slots=slots, default_model=default_model,
                                max_new_tokens_limit=max_new_limit, sources=sources)
        request.concurrent = request.concurrent and on_gpu
        yield _outputs(f"Loading **{request.model}** …", None, plot=None, results=None)
        loaded = _load(cache, request.model)
        comparison = Comparison(loaded, request, cache, max_prompt_tokens)
    except AppError as err:
        gr.Warning(str(err))
        yield _outputs(f"**⚠️ {err}**", None, results={"error": str(err)})
        return
    except Exception as err:  # noqa: BLE001 - e.g. a tokenizer that cannot encode the prompt
        logger.exception("preparing the comparison failed")
        message = f"Unexpected error: {describe_error(err)}"
        gr.Warning(message)
        yield _outputs(f"**⚠️ {message}**", None, results={"error": message})
        return
    try:
        for running in comparison.run():
            yield _outputs(_running_status(comparison, running), comparison)
    except Exception as err:  # noqa: BLE001 - unexpected: logged in full, summarised in the page
        logger.exception("comparison failed")
        yield _outputs(f"**⚠️ Unexpected error:** {describe_error(err)}", comparison, results={"error": str(err)})
        return
    finally:
        comparison.cancel()  # no-op when done; stops the threads when the visitor left or pressed Stop
    for trace in comparison.traces:
        if trace.status == "error":
            gr.Warning(f"{trace.spec.label}: {trace.error}")
    yield _outputs(_final_status(comparison), comparison, plot=comparison_figure(comparison.traces),
                   results=comparison.results())


def _load(cache: ModelCache, name: str) -> Any:
    try:
        return cache.get(name)
    except Exception as err:  # noqa: BLE001 - any loading failure is the visitor's model choice
        known = ", ".join(REGISTRY)
        raise AppError(f"Cannot load model {name!r}: {describe_error(err)} (registry models: {known})") from err


def _outputs(status: str, comparison: Comparison | None, *, plot: Any = gr.skip(), results: Any = gr.skip()) -> tuple:
    """``(status, *panes, plot, results)``; ``gr.skip()`` leaves an output as it is."""
    if comparison is None:
        panes = [gr.skip()] * MAX_PANES
    else:
        panes = [gr.update(value=_pane_html(comparison, i), visible=True) for i in range(len(comparison.traces))]
        panes += [gr.update(value="", visible=False)] * (MAX_PANES - len(panes))
    return (status, *panes, plot, results)


def _pane_html(comparison: Comparison, index: int) -> str:
    trace, text = comparison.traces[index], comparison.texts[index]
    return render_pane(
        order=index + 1, method=trace.spec.name, label=trace.spec.label + (" (baseline)" if index == 0 else ""),
        status=trace.status, status_text=_pane_status(trace), figures=_figures(comparison, trace), segments=text.segments,
        badge=_badge(comparison, trace, index), error=trace.error,
    )


def _pane_status(trace: MethodTrace) -> str:
    if trace.status == "done":
        return f"done in {trace.seconds:.2f} s"
    return {"running": "running…", "waiting": "waiting"}.get(trace.status, trace.status)


def _figures(comparison: Comparison, trace: MethodTrace) -> str:
    if trace.status == "waiting" or (trace.status == "error" and not trace.ids):
        return ""
    speedup, tau, rate = comparison.speedup(trace), trace.tau, trace.acceptance_rate
    return " · ".join([
        f"{trace.tokens_per_s:.1f} tok/s",
        "speedup " + ("—" if speedup is None else f"{speedup:.2f}×"),
        "τ " + ("—" if tau is None else f"{tau:.2f}"),
        "acceptance " + ("—" if rate is None else f"{rate:.0%}"),
        f"{trace.target_forwards} target forwards",
        f"{trace.new_tokens} tokens",
    ])


def _badge(comparison: Comparison, trace: MethodTrace, index: int) -> tuple[str, str] | None:
    if index == 0:
        return ("info", "baseline") if trace.status == "done" else None
    same = comparison.identical(trace)
    if same is None:
        return None
    # under sampling every pane draws with the request's seed (streaming.generate_into): one seed, one text
    what = "greedy's sample" if comparison.request.sampling else "greedy"
    return ("yes", f"identical to {what} ✓") if same else ("no", f"differs from {what} ✗")


def _running_status(comparison: Comparison, running: int) -> str:
    trace = comparison.traces[running]
    mode = "all at once" if comparison.request.concurrent else "one after another, greedy first"
    return (f"Running **{running + 1}/{len(comparison.traces)}: {trace.spec.label}** on "
            f"{describe_device(comparison.loaded.device)} ({mode}) · prompt {comparison.prompt_tokens} tokens")


def _final_status(comparison: Comparison) -> str:
    done = [t for t in comparison.traces if t.status == "done"]
    failed = [t.spec.label for t in comparison.traces if t.status == "error"]
    text = (f"Done: {len(done)}/{len(comparison.traces)} methods on **{comparison.loaded.name}** "
            f"({describe_device(comparison.loaded.device)}) · prompt {comparison.prompt_tokens} tokens")
    if failed:
        text += f" · **⚠️ failed: {', '.join(failed)}** (see the pane)"
    if any(t.status == "cancelled" for t in comparison.traces):
        text += " · stopped"
    return text
