from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from jobs.media.storage import media_origins

# The quality tiers the page offers (the API's `quality`; standard/hd are OpenAI's aliases).
PAGE_QUALITIES = (("auto", "Default"), ("low", "Low"), ("medium", "Medium"), ("high", "High"))


def page_catalogue() -> list[dict]:
    """Per served model what the page shows beside the choice: its steps (the GPU work an image
    costs) at its defaults and at each quality tier, and the tier's levers."""
    from jobs.api.openai.compat import steps_for, variant_for
    from scheduling import catalogue

    models = []
    for m in catalogue.served().values():
        tiers = {q: {"steps": steps_for(q, m.version), "levers": variant_for(q, m.version)} for q, _ in PAGE_QUALITIES if q != "auto"}
        tiers["auto"] = {"steps": m.default_steps, "levers": ""}
        models.append({"version": m.version, "label": m.label, "default": m.default, "default_steps": m.default_steps,
                       "min_steps": m.min_steps, "max_steps": m.max_steps, "guidance_scale": m.guidance_scale, "tiers": tiers})
    return models


@login_required
@ensure_csrf_cookie  # the page's script reads csrftoken for X-CSRFToken on POSTs
def index(request):
    sizes = [f"{w}x{h}" for w, h in settings.IMAGEGEN_SIZE_MENU]
    models = page_catalogue()
    return render(
        request,
        "jobs/index.html",
        {
            "sizes": sizes,
            "max_steps": settings.IMAGEGEN_MAX_STEPS,
            "min_steps": settings.IMAGEGEN_MIN_STEPS,
            "default_steps": settings.IMAGEGEN_DEFAULT_STEPS,
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
