"""Dataset uploads refused by their declared size before any of the body is read.

Django's CSRF check parses a multipart body (spooling its files to disk) before a view runs,
so the view's own size check would come after a huge upload had been stored; this runs first.
"""

import re

from django.http import HttpResponse, JsonResponse

from ylink.services.datasets import max_upload_bytes

UPLOAD_PATH = re.compile(r"^/(api/v1/ylink/)?datasets/\d+/upload/$")


class UploadSizeMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and UPLOAD_PATH.match(request.path_info):
            length = request.META.get("CONTENT_LENGTH") or ""
            limit = max_upload_bytes()
            if length.isdigit() and int(length) > limit:
                message = (f"The upload is {int(length) / 2**20:.0f} MiB; uploads are limited "
                           f"to {limit // 2**20} MiB (OGAI_DATASET_MAX_UPLOAD_MIB).")
                if request.path_info.startswith("/api/"):
                    return JsonResponse({"code": "too_large", "message": message,
                                         "fields": {"file": [message]}}, status=413)
                return HttpResponse(message, status=413, content_type="text/plain")
        return self.get_response(request)
