"""ASGI entry point: HTTP through Django, websockets through Channels."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "imagegen.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from jobs.client_gone import ClientGone  # noqa: E402
from jobs.routing import websocket_urlpatterns  # noqa: E402
from jobs.ws_auth import TokenOrSessionAuthMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ClientGone(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            TokenOrSessionAuthMiddleware(URLRouter(websocket_urlpatterns))
        ),
    }
)
