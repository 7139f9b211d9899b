"""The Gradio page: :func:`build_app` builds the Blocks; nothing is loaded or launched at import."""

from __future__ import annotations

import html
import inspect
import logging
from typing import Any, Iterator

from ..extras import require
from ..tooling.methods import get_method
from ..registry.models import DEFAULT_MODEL, REGISTRY
from .cache import ModelCache, describe_device
from .calls import AppBlocks, exception_handlers
from .examples import EXAMPLES
from .highlight import LEGEND_HTML, PANE_CSS, render_pane
from .limits import MAX_BODY_BYTES, middleware
from .offer import check_downloads, draft_models, method_problems, served_models, trained_sources
from .plots import comparison_figure
from .queue_share import DEFAULT_PER_SESSION, QueueShare, default_per_address
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
<p>Plain decoding (greedy, or plain sampling when <i>Sample</i> is ticked) runs first, then each method you pick,
on the same model and prompt. Every output streams live; <span class="hfs-draft">highlighted</span> text came
from drafts the target accepted, the rest the target produced itself (one token per target forward). Every
method must give exactly the plain decoding's text (under sampling: the same sample for the same seed): the
badge under each pane says whether it did.</p>
"""

MAX_UPLOAD = 0
"""Bytes a visitor may upload: the app has no file input, so gradio's upload route takes nothing."""


def build_app(
    cache: ModelCache | None = None,
    *,
    default_model: str = DEFAULT_MODEL,
    default_methods: list[str] | None = None,
    max_queue: int = 16,
    concurrency_limit: int | None = None,
    max_per_session: int = DEFAULT_PER_SESSION,
    max_per_address: int | None = None,
    max_body_bytes: int | None = MAX_BODY_BYTES,
    max_prompt_tokens: int = 2048,
    max_new_tokens_limit: int = 512,
    default_max_new_tokens: int = 128,
    allow_local_paths: bool = False,
    allow_downloads: bool = False,
) -> gr.Blocks:
    """Build the demo's Blocks (models load on the first request, not here).

    Visitors pick the model, draft models, EAGLE drafters and exit adapters from lists: the registry's
    models on the server's disk and ``default_model``, the shipped drafters. Every value the ``/compare`` API
    receives is checked on the server (:func:`~hf_speculative.app.request.parse_request`), and every method's
    prerequisites before anything runs (:class:`~hf_speculative.app.session.Comparison`).

    Args:
        cache (`ModelCache`, *optional*): shared model cache (a fresh one on the default device if omitted).
        default_model (`str`): model selected when the page opens (registry name or local folder); the
            operator's choice, so it is offered even when it is a folder.
        default_methods (`list[str]`, *optional*): methods ticked when the page opens.
        max_queue (`int`): requests waiting at most; later visitors are told the queue is full.
        concurrency_limit (`int`, *optional*): comparisons running at once (default: 1 on CPU, where
            two would distort each other's timings, 2 on a GPU).
        max_per_session (`int`): comparisons one session (an open page, a ``gradio_client.Client``) may have
            waiting or running; more are refused at once with HTTP 429 and a message (0: no bound).
        max_per_address (`int`, *optional*): the same for one IP address (default: half of ``max_queue``; 0: no
            bound, behind a proxy that hides visitors' addresses). See :mod:`hf_speculative.app.queue_share`.
        max_body_bytes (`int`, *optional*): bytes one HTTP request body may hold: a larger one gets 413 before
            gradio reads it (:mod:`hf_speculative.app.limits`; default 512 KiB; ``None`` or 0: no limit).
        max_prompt_tokens (`int`): longest prompt accepted, chat template included.
        max_new_tokens_limit (`int`): upper bound of the "max new tokens" slider.
        default_max_new_tokens (`int`): its initial value.
        allow_local_paths (`bool`): let visitors also type any local folder or Hub id (``app.py
            --allow-local-paths``), for a local run only: refused on a Space (``SPACE_ID``), and
            ``launch()`` refuses a host beyond localhost or a share link.
        allow_downloads (`bool`): let visitors pick registry models that are not on the server's disk, which
            the server then downloads and converts (``app.py --allow-downloads``); refused on a Space. Without
            it only models already on disk are served, the others shown disabled.

    Returns:
        `gr.Blocks` with its queue configured; call ``.launch()`` on it (uploads are refused: the app has no
        file input, and its ``launch()`` sets gradio's ``max_file_size`` to 0 unless given).

    Raises:
        ValueError: ``allow_local_paths`` or ``allow_downloads`` on a Space.
    """
    check_exposure(allow_local_paths)
    check_downloads(allow_downloads)
    share = QueueShare(per_session=max_per_session,
                       per_address=default_per_address(max_queue) if max_per_address is None else max_per_address)
    _check_body_limit(max_body_bytes)
    cache = cache or ModelCache()
    sources = Sources.offered(default_model, allow_local_paths=allow_local_paths, allow_downloads=allow_downloads)
    on_gpu = cache.device.type == "cuda"
    slots = option_slots()
    served, unserved = served_models(sources)
    runnable, disabled = _method_choices(default_model, sources)
    wanted = default_methods or ["prompt-lookup", "hf-prompt-lookup"]
    ticked = [m for m in wanted if m in runnable][: MAX_PANES - 1] or runnable[:1]
    running: dict[str, Comparison] = {}  # session -> its comparison in progress (for Stop)

    # analytics off: no calls home from a demo that may run offline or on a visitor-facing Space
    with AppBlocks(title="hf_speculative: speculative decoding demo", analytics_enabled=False) as demo:
        gr.HTML(INTRO_HTML, css_template=PANE_CSS)
        gr.Markdown(f"**Device:** {describe_device(cache.device)} · {_versions()}", elem_id="hfs-device")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(label="Prompt", lines=10, placeholder="Type a prompt or pick an example below",
                                    elem_id="hfs-prompt")
                gr.Examples(examples=[[text] for text in EXAMPLES.values()], inputs=[prompt],
                            example_labels=list(EXAMPLES), label="Examples")
            with gr.Column(scale=2):
                model = gr.Dropdown(choices=served, value=default_model, allow_custom_value=allow_local_paths,
                                    label="Model", info="registry name, local folder or Hub id" if allow_local_paths
                                    else "the models on this server", elem_id="hfs-model")
                gr.HTML(_unavailable_html("Not offered", unserved), css_template=PANE_CSS,
                        elem_id="hfs-models-off", visible=bool(unserved))
                methods = gr.CheckboxGroup(choices=_labelled(runnable), value=ticked,
                                           label=f"Methods (plain decoding always runs first; up to {MAX_PANES - 1})",
                                           elem_id="hfs-methods")
                methods_off = gr.HTML(_unavailable_html("Cannot run on this model", disabled), css_template=PANE_CSS,
                                      elem_id="hfs-methods-off", visible=bool(disabled))
                max_new = gr.Slider(1, max_new_tokens_limit, value=default_max_new_tokens, step=1,
                                    label="Max new tokens")
                sampling = gr.Checkbox(value=False, label="Sample (else greedy)", elem_id="hfs-sample")
                # each with the width its content needs (the slider's label, number box and reset button take
                # 171 px, over gradio's 160 px default, which left a scrollbar under it): the row wraps instead
                with gr.Row():
                    temperature = gr.Slider(*TEMPERATURE_RANGE, value=0.7, step=0.05, label="Temperature",
                                            min_width=200, elem_id="hfs-temperature")
                    seed = gr.Number(value=0, precision=0, minimum=0, maximum=MAX_SEED, label="Seed", min_width=120,
                                     elem_id="hfs-seed")
                concurrent = gr.Checkbox(value=False, interactive=on_gpu, label="Run methods at the same time",
                                         info="GPU only; on CPU methods run one after another for fair timings")
        groups, option_inputs, draft_inputs = _option_inputs(slots, sources, default_model, ticked)
        with gr.Row():
            run_btn = gr.Button("Generate and compare", variant="primary", elem_id="hfs-run")
            stop_btn = gr.Button("Stop", variant="secondary", interactive=False, elem_id="hfs-stop")
        status = gr.Markdown("Ready.", label="status", show_label=False, elem_id="hfs-status")
        gr.HTML(LEGEND_HTML, css_template=PANE_CSS)
        with gr.Row(equal_height=False):
            panes = [gr.HTML(visible=False, css_template=PANE_CSS, label=_pane_name(i), elem_id=f"hfs-pane-{i}")
                     for i in range(MAX_PANES)]
        plot = gr.Plot(label="Tokens over time and accepted length per step", elem_id="hfs-plot")
        with gr.Accordion("Raw results (JSON)", open=False):
            results = gr.JSON(label="results", elem_id="hfs-results")

        def compare(request: gr.Request, prompt, model, methods, max_new_tokens, sample, temperature, seed,
                    concurrent, *option_values) -> Iterator[tuple]:
            session = getattr(request, "session_hash", None) or ""
            try:
                yield from _run_comparison(
                    cache, slots, default_model, max_new_tokens_limit, max_prompt_tokens,
                    (prompt, model, methods, max_new_tokens, sample, temperature, seed, concurrent, list(option_values)),
                    sources=sources, on_gpu=on_gpu, register=lambda comparison: running.__setitem__(session, comparison),
                )
            finally:
                running.pop(session, None)

        compare.__signature__ = _api_signature(compare, slots)  # named API parameters for the options

        def stop(request: gr.Request) -> tuple:
            comparison = running.get(getattr(request, "session_hash", None) or "")
            if comparison is None:
                return ("**Stopped.**", *[gr.skip()] * MAX_PANES, gr.skip(), gr.skip(), _stop_button(False))
            comparison.cancel(stopped=True)
            comparison.refresh_texts(final=True)
            return (*_outputs(_stopped_status(comparison), comparison, plot=_figure(comparison),
                              results=comparison.results()), _stop_button(False))

        ui = {"api_visibility": "private", "concurrency_limit": None}  # page-only helpers, never queued behind a run
        model.change(lambda name, picked: _on_model(name, picked, sources), inputs=[model, methods],
                     outputs=[methods, methods_off, *draft_inputs], **ui)
        methods.input(_at_most, inputs=[methods], outputs=[methods], **ui)
        methods.change(lambda picked: [gr.update(visible=name in (picked or [])) for name in groups],
                       inputs=[methods], outputs=list(groups.values()), **ui)
        run_btn.click(lambda: _stop_button(True), outputs=[stop_btn], **ui)
        event = run_btn.click(
            compare,
            inputs=[prompt, model, methods, max_new, sampling, temperature, seed, concurrent, *option_inputs],
            outputs=[status, *panes, plot, results],
            api_name="compare",
            # the handler gets the values as sent and checks every one (parse_request): a client of the API
            # gets the app's own messages, not the components' checks (some of which raise on NaN or text)
            preprocess=False,
        )
        event.then(lambda: _stop_button(False), outputs=[stop_btn], **ui)
        stop_btn.click(stop, outputs=[status, *panes, plot, results, stop_btn], cancels=[event], **ui)
    demo.queue(max_size=max_queue, default_concurrency_limit=concurrency_limit or (2 if on_gpu else 1))
    share.install(demo)
    _guard_launch(demo, allow_local_paths, max_body_bytes)
    return demo


def _pane_name(index: int) -> str:
    """The API's name of pane ``index``'s output (the baseline's is ``pane_1_baseline``)."""
    return "pane_1_baseline" if index == 0 else f"pane_{index + 1}"


def _check_body_limit(max_body_bytes: Any) -> None:
    if max_body_bytes is None:
        return
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 0:
        raise ValueError(f"build_app(max_body_bytes={max_body_bytes!r}): a whole number of bytes >= 0 (0 or None: "
                         "no limit), e.g. 524288.")


def _stop_button(active: bool) -> Any:
    """Stop: red and pressable while a comparison runs, grey and disabled while idle."""
    return gr.update(variant="stop" if active else "secondary", interactive=active)


def _guard_launch(demo: gr.Blocks, allow_local_paths: bool, max_body_bytes: int | None = MAX_BODY_BYTES) -> None:
    """Make ``demo.launch()`` refuse uploads (``max_file_size=0`` unless given: the app has no file input) and
    request bodies over ``max_body_bytes`` (:class:`~hf_speculative.app.limits.BodyLimit` in front of gradio's
    routes) and, with ``allow_local_paths``, a host beyond localhost or a share link."""
    launch = demo.launch

    def guarded_launch(*args: Any, **kwargs: Any) -> Any:
        if allow_local_paths:
            check_exposure(True, kwargs.get("server_name"), bool(kwargs.get("share")))
        kwargs.setdefault("max_file_size", MAX_UPLOAD)
        app_kwargs = dict(kwargs.get("app_kwargs") or {})
        app_kwargs["middleware"] = [middleware(max_body_bytes), *app_kwargs.get("middleware", [])]
        app_kwargs["exception_handlers"] = {**exception_handlers(demo), **app_kwargs.get("exception_handlers", {})}
        kwargs["app_kwargs"] = app_kwargs
        return launch(*args, **kwargs)

    demo.launch = guarded_launch


def _labelled(names: list[str]) -> list[tuple[str, str]]:
    return [(get_method(m).label, m) for m in names]


def _method_choices(model: str, sources: Sources) -> tuple[list[str], dict[str, str]]:
    """``(methods that can run on model, {method: why not})``."""
    problems = method_problems(model, sources) if model else {}
    return [m for m in selectable_methods() if m not in problems], problems


def _unavailable_html(title: str, problems: dict[str, str]) -> str:
    """Disabled checkboxes, one per name that cannot be picked, each with its reason (a reason shared by all of
    them is said once, in the title)."""
    if not problems:
        return ""
    shared = len(problems) > 1 and len(set(problems.values())) == 1
    if shared:
        title = f"{title}: {next(iter(problems.values()))}"
    rows = "".join(
        f'<label class="hfs-off-item" data-name="{html.escape(name)}" title="{html.escape(reason)}">'
        f'<input type="checkbox" disabled> <b>{html.escape(get_method(name).label if _is_method(name) else name)}</b>'
        f'{"" if shared else ": " + html.escape(reason)}</label>'
        for name, reason in problems.items())
    return f'<div class="hfs-off"><div class="hfs-off-title">{html.escape(title)}</div>{rows}</div>'


def _is_method(name: str) -> bool:
    try:
        get_method(name)
        return True
    except ValueError:
        return False


def _on_model(name: Any, picked: Any, sources: Sources) -> list:
    """A model was chosen: its runnable methods (the ticked ones that still run stay ticked), the disabled ones
    with their reasons, and the draft models that share its tokenizer."""
    name = name if isinstance(name, str) else ""
    runnable, disabled = _method_choices(name, sources)
    kept = [m for m in (picked or []) if m in runnable][: MAX_PANES - 1]
    drafts = _draft_choices(name, sources)
    return [gr.update(choices=_labelled(runnable), value=kept),
            gr.update(value=_unavailable_html(f"Cannot run on {name}", disabled), visible=bool(disabled)),
            *[gr.update(choices=drafts, value=None) for _ in range(_draft_slot_count())]]


def _at_most(picked: Any) -> Any:
    """Keep at most three ticked methods: a fourth tick is undone at once, with a message."""
    picked = list(picked or [])
    if len(picked) <= MAX_PANES - 1:
        return gr.skip()
    gr.Warning(f"At most {MAX_PANES - 1} methods run beside plain decoding: untick one before ticking another.")
    return gr.update(value=picked[: MAX_PANES - 1])


def _draft_choices(model: str, sources: Sources) -> list[str]:
    if sources.allow_local_paths:
        return [m for m in served_models(sources)[0] if m != model]
    return draft_models(model, sources) if model else []


def _draft_slot_count() -> int:
    return sum(1 for slot in option_slots() if slot.widget == "model")


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


def _option_inputs(slots: list[OptionSlot], sources: Sources, default_model: str,
                   ticked: list[str]) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """One input per method option, in one group per method, shown only while the method is ticked.
    Returns ``({method: group}, inputs in slot order, the draft model inputs)``."""
    groups, inputs, drafts = {}, [], []
    with gr.Accordion("Method options (of the ticked methods; blank: the method's default)", open=False,
                      elem_id="hfs-options"):
        for name in dict.fromkeys(slot.method for slot in slots):
            spec = get_method(name)
            with gr.Group(visible=name in ticked, elem_id=f"hfs-options-{_identifier(name)}") as group:
                gr.Markdown(f"**{spec.label}**: {spec.description}")
                with gr.Row():
                    for slot in (s for s in slots if s.method == name):
                        component = _option_input(slot, sources, default_model)
                        inputs.append(component)
                        if slot.widget == "model":
                            drafts.append(component)
            groups[name] = group
    return groups, inputs, drafts


def _option_input(slot: OptionSlot, sources: Sources, default_model: str) -> gr.components.Component:
    label, info = f"{slot.key}", slot.help or None
    if slot.widget == "model":
        return gr.Dropdown(choices=_draft_choices(default_model, sources), value=slot.default,
                           allow_custom_value=sources.allow_local_paths, label=label, info=info)
    if slot.widget == "drafter":
        return gr.Dropdown(choices=list(sources.for_key(slot.key)), value=slot.default,
                           allow_custom_value=sources.allow_local_paths, label=label, info=info)
    if slot.widget == "bool":
        return gr.Checkbox(value=bool(slot.default), label=label, info=info)
    # numbers too: blank (None) is the method's default, shown empty with the placeholder "default" (gradio's
    # Number shows 0 for an empty value); the server checks the text as a number (request.parse_request)
    return gr.Textbox(value=None if slot.default is None else str(slot.default), label=label, info=info,
                      placeholder="default", max_lines=1)


# -- one request ---------------------------------------------------------------------------------
def _run_comparison(cache, slots, default_model, max_new_limit, max_prompt_tokens, form, *,
                    sources: Sources | None = None, on_gpu: bool = False,
                    register: Any = None) -> Iterator[tuple]:
    """The event handler's body: validate, load, prepare every method, run, and yield the page's outputs as they
    change. ``register(comparison)`` is called once the comparison is ready (the page's Stop finds it so)."""
    *values, option_values = form
    sources = sources or Sources.offered(default_model)
    try:
        request = parse_request(*values, option_values, slots=slots, default_model=default_model,
                                max_new_tokens_limit=max_new_limit, sources=sources)
        request.concurrent = request.concurrent and on_gpu
        yield _outputs(f"Loading **{request.model}** and preparing the methods …", None, plot=None, results=None)
        loaded = _load(cache, request.model)
        comparison = Comparison(loaded, request, cache, max_prompt_tokens, sources)
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
    if register is not None:
        register(comparison)
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
    status = _stopped_status(comparison) if comparison.stopped else _final_status(comparison)
    yield _outputs(status, comparison, plot=_figure(comparison), results=comparison.results())


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


def _figure(comparison: Comparison) -> Any:
    return comparison_figure(comparison.traces, [_label(comparison, i).removesuffix(" (baseline)")
                                                 for i in range(len(comparison.traces))])


def _label(comparison: Comparison, index: int) -> str:
    """A pane's title: the baseline is plain sampling when the request samples, else greedy."""
    trace = comparison.traces[index]
    if index == 0:
        return ("Plain sampling" if comparison.request.sampling else trace.spec.label) + " (baseline)"
    return trace.spec.label


def _pane_html(comparison: Comparison, index: int) -> str:
    trace, text = comparison.traces[index], comparison.texts[index]
    return render_pane(
        order=index + 1, method=trace.spec.name, label=_label(comparison, index),
        status=trace.status, status_text=_pane_status(trace), figures=_figures(comparison, trace), segments=text.segments,
        badge=_badge(comparison, trace, index), error=trace.error, note=pane_note(trace),
    )


def _pane_status(trace: MethodTrace) -> str:
    if trace.status == "done":
        return f"done in {trace.seconds:.2f} s"
    if trace.status == "cancelled":
        return f"stopped after {trace.new_tokens} tokens" if trace.started is not None else "stopped before it ran"
    return {"running": "running…", "waiting": "waiting"}.get(trace.status, trace.status)


def pane_note(trace: MethodTrace) -> str:
    """Why a method ran as it did when that is not a bug, read from its statistics: calibrating (LayerSkip's
    first call on a model), drafting nothing, or drafting rarely (the cost model judged drafts not worth their
    verification on this device)."""
    stats = trace.final_stats or trace.live_stats
    if stats is None or trace.status == "waiting":
        return ""
    for info in stats.extra.values():  # the self-speculative drafters say how they chose their layers
        if not isinstance(info, dict):
            continue
        source, drafting = info.get("source"), info.get("drafting")
        if source == "waiting":
            return (f"calibrating (first call on this model): drafts start after {info.get('calibration_tokens')} "
                    "generated tokens, once it has measured which layers to skip")
        idle = "no set of skipped layers pays for its verification on this device, so it drafts nothing"
        if source == "calibrated":
            seconds = info.get("calibration_s")
            took = f", {seconds:.0f} s of this call" if isinstance(seconds, (int, float)) else ""
            return (f"calibrating (first call on this model{took}): it measured which layers to skip; "
                    + (idle if drafting is False else "later calls draft from the start"))
        if drafting is False:
            return f"no drafts: {idle}"
    if trace.status not in ("done", "cancelled") or stats.target_forwards <= 1:
        return ""
    if stats.drafted_tokens == 0:
        if _drafts_from_a_model(trace.spec.name):
            return "no drafts: verification too dear on this device (the cost model found no draft worth it)"
        return "no drafts: nothing in the text matched well enough to pay for a verification on this device"
    drafted = stats.steps()["drafted"]
    drafting_steps = sum(1 for n in drafted if n)
    # (a lookup method drafts where the text repeats itself: few drafts there is the text, not the cost model)
    if drafting_steps * 4 < len(drafted) and _drafts_from_a_model(trace.spec.name):
        return (f"few drafts: it drafted at {drafting_steps} of {len(drafted)} target forwards ({stats.accepted_tokens} "
                f"of {stats.drafted_tokens} draft tokens accepted); the cost model judged more drafts not worth "
                "their verification on this device")
    return ""


def _drafts_from_a_model(method: str) -> bool:
    """The method drafts with a network (the target's layers, a draft model, a trained drafter), so it always has
    a draft to offer: drafting nothing means the cost model judged none worth its verification."""
    spec = get_method(method)
    return bool(trained_sources(method)) or bool({"exit_layer", "skip", "draft_model"} & set(spec.options))


def _figures(comparison: Comparison, trace: MethodTrace) -> str:
    if trace.status == "waiting" or (trace.status in ("error", "cancelled") and not trace.ids):
        return ""
    speedup, tau = comparison.speedup(trace), trace.tau
    return " · ".join([
        f"{trace.tokens_per_s:.1f} tok/s",
        "speedup " + ("—" if speedup is None else f"{speedup:.2f}×"),
        "τ " + ("—" if tau is None else f"{tau:.2f}"),
        acceptance_figure(trace),
        f"{trace.target_forwards} target forwards",
        f"{trace.new_tokens} tokens",
    ])


def acceptance_figure(trace: MethodTrace) -> str:
    """Accepted over drafted tokens, or why there is no such figure: transformers' own methods do not report how
    many tokens they drafted (only what was accepted reaches the streamer, which τ counts), and a method that
    drafted nothing has no rate."""
    rate = trace.acceptance_rate
    if rate is not None:
        return f"acceptance {rate:.0%}"
    if trace.spec.kind == "baseline":
        return "acceptance — (no drafts)"
    if trace.spec.kind == "transformers":
        return "acceptance — (transformers does not report its drafted tokens)"
    return "acceptance — (nothing drafted)" if trace.drafted_tokens == 0 else "acceptance —"


def _badge(comparison: Comparison, trace: MethodTrace, index: int) -> tuple[str, str] | None:
    if index == 0:
        return ("info", "baseline") if trace.status == "done" else None
    same = comparison.identical(trace)
    if same is None:
        return None
    # under sampling every pane draws with the request's seed (streaming.generate_into): one seed, one text
    what = "plain sampling" if comparison.request.sampling else "greedy"
    return ("yes", f"identical to {what} ✓") if same else ("no", f"differs from {what} ✗")


def _running_status(comparison: Comparison, running: int) -> str:
    mode = "all at once" if comparison.request.concurrent else "one after another, the baseline first"
    return (f"Running **{running + 1}/{len(comparison.traces)}: {_label(comparison, running)}** on "
            f"{describe_device(comparison.loaded.device)} ({mode}) · prompt {comparison.prompt_tokens} tokens")


def _stopped_status(comparison: Comparison) -> str:
    """The status after the visitor pressed Stop: what ran to the end, what was cut, what never ran."""
    done = [t for t in comparison.traces if t.status == "done"]
    cut = [t for t in comparison.traces if t.status == "cancelled" and t.started is not None]
    never = [t for t in comparison.traces if t.status == "cancelled" and t.started is None]
    text = f"**Stopped.** {len(done)}/{len(comparison.traces)} methods finished on **{comparison.loaded.name}**"
    if cut:
        text += " · cut short: " + ", ".join(f"{_label(comparison, comparison.traces.index(t))} "
                                             f"({t.new_tokens} tokens)" for t in cut)
    if never:
        text += " · not run: " + ", ".join(_label(comparison, comparison.traces.index(t)) for t in never)
    return text


def _final_status(comparison: Comparison) -> str:
    done = [t for t in comparison.traces if t.status == "done"]
    failed = [t.spec.label for t in comparison.traces if t.status == "error"]
    text = (f"Done: {len(done)}/{len(comparison.traces)} methods on **{comparison.loaded.name}** "
            f"({describe_device(comparison.loaded.device)}) · prompt {comparison.prompt_tokens} tokens")
    if comparison.request.sampling:
        text += (f" · sampling at temperature {comparison.request.sampling['temperature']:g}, "
                 f"seed {comparison.request.sampling['seed']}")
    if failed:
        text += f" · **⚠️ failed: {', '.join(failed)}** (see the pane)"
    if any(t.status == "cancelled" for t in comparison.traces):
        text += " · stopped"
    return text
