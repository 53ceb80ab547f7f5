from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.templatetags.static import static
from django.views.decorators.csrf import ensure_csrf_cookie

from jobs.media.storage import media_origins

# The quality tiers the page offers (the API's `quality`; standard/hd are OpenAI's aliases).
PAGE_QUALITIES = (("auto", "Default"), ("low", "Low"), ("medium", "Medium"), ("high", "High"))


def page_catalogue() -> list[dict]:
    """Per served model what the page shows beside the choice: its steps (the GPU work an image
    costs) at its defaults and at each quality tier, the tier's levers, and whether it takes a
    negative prompt (`negative_note`: why not, the words the API's 400 would use)."""
    from jobs.api.openai.compat import steps_for, variant_for
    from scheduling import catalogue, heartbeats, lanes

    models = []
    for m in catalogue.served().values():
        tiers = {q: {"steps": steps_for(q, m.version), "levers": variant_for(q, m.version)} for q, _ in PAGE_QUALITIES if q != "auto"}
        tiers["auto"] = {"steps": m.default_steps, "levers": ""}
        # As jobs/api/serializers.py refuses one: the profile, then what the lane's live workers said.
        refusal = "" if m.negative_prompt else f"{m.version} takes no negative prompt (its guidance is distilled in)"
        refusal = refusal or (heartbeats.capabilities(lanes.lane_of(m.version)) or {}).get("negative_prompt_refusal") or ""
        models.append({"version": m.version, "label": m.label, "default": m.default, "default_steps": m.default_steps,
                       "min_steps": m.min_steps, "max_steps": m.max_steps, "guidance_scale": m.guidance_scale, "tiers": tiers,
                       "negative_prompt": not refusal, "negative_note": refusal,
                       # A video model: the frames a clip costs and the only sizes it draws (docs/video.md).
                       "frames": m.frames, "sizes": [f"{w}x{h}" for w, h in m.sizes]})
    return models


@login_required
@ensure_csrf_cookie  # the page's script reads csrftoken for X-CSRFToken on POSTs
def index(request):
    sizes = [f"{w}x{h}" for w, h in settings.IMAGEGEN_SIZE_MENU]
    models = page_catalogue()
    # The form opens at the default model's steps (a model with a floor, shapes-v2's 12, opened
    # at the deployment's 4: a value the summary would repeat and the API refuse).
    default = next((m for m in models if m["default"]), None)
    return render(
        request,
        "jobs/index.html",
        {
            "sizes": sizes,
            "max_steps": default["max_steps"] if default else settings.IMAGEGEN_MAX_STEPS,
            "min_steps": default["min_steps"] if default else settings.IMAGEGEN_MIN_STEPS,
            "default_steps": default["default_steps"] if default else settings.IMAGEGEN_DEFAULT_STEPS,
            "max_count": settings.IMAGEGEN_MAX_COUNT,
            "default_guidance": settings.IMAGEGEN_DEFAULT_GUIDANCE,
            "max_prompt_chars": settings.IMAGEGEN_MAX_PROMPT_CHARS,
            "media_origins": media_origins(),  # where images come from besides this origin (a bucket, a CDN)
            "output_formats": ["png", "jpeg", "webp"],
            "models": models,
            "qualities": PAGE_QUALITIES,
            # The prompt rewriter's switch: shown where one is configured, ticked as the server's default.
            "rewriter": bool(settings.IMAGEGEN_REWRITER_PATH),
            "rewrite_default": settings.IMAGEGEN_REWRITE_DEFAULT == "on",
        },
    )


def favicon(request):
    """/favicon.ico, which browsers ask for on pages that link none (sign-in, admin): the page's icon."""
    return HttpResponseRedirect(static("imagegen/favicon.svg"))
