"""TEST ONLY. One view: who does this session cookie authenticate (JSON)."""

from django.http import JsonResponse
from django.urls import path


def whoami(request):
    user = request.user
    return JsonResponse(
        {
            "authenticated": bool(user.is_authenticated),
            "user_id": user.pk if user.is_authenticated else None,
            "username": user.get_username() if user.is_authenticated else None,
        }
    )


urlpatterns = [path("whoami", whoami)]
