from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


@login_required
@ensure_csrf_cookie  # the page's script reads csrftoken for X-CSRFToken on POSTs
def index(request):
    from scheduling import catalogue

    sizes = [f"{w}x{h}" for w, h in settings.IMAGEGEN_SIZE_MENU]
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
            "output_formats": ["png", "jpeg", "webp"],
            "models": list(catalogue.served().values()),
        },
    )
