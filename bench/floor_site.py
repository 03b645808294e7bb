"""The project with one more endpoint, for ``bench/api_floor.py``: the floor of an append.

The URLconf of the benchmark's server (``DJANGO_SETTINGS_MODULE=bench.floor_settings``): the
project's URLs plus ``POST /floor/messages/``, a minimal DRF view with the same token
authentication as the memory API that does one INSERT into a table of its own. Whatever our
endpoint costs beyond it is ours.
"""

from django.db import connection
from django.urls import path
from rest_framework import status
from rest_framework.authentication import TokenAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from project.urls import urlpatterns as project_urlpatterns

FLOOR_TABLE = "bench_floor_message"


class FloorAppend(APIView):
    """POST {"role", "content"}: one INSERT, 201 with the new row's id."""

    authentication_classes = [TokenAuthentication]
    permission_classes = [IsAuthenticated]

    def post(self, request):
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {FLOOR_TABLE} (user_id, role, content) VALUES (%s, %s, %s) "
                "RETURNING id",
                [request.user.pk, request.data.get("role"), request.data.get("content")],
            )
            (pk,) = cursor.fetchone()
        return Response({"id": pk}, status=status.HTTP_201_CREATED)


urlpatterns = [*project_urlpatterns, path("floor/messages/", FloorAppend.as_view())]
