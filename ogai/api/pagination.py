from rest_framework.pagination import LimitOffsetPagination as BaseLimitOffsetPagination


class LimitOffsetPagination(BaseLimitOffsetPagination):
    """`?limit=&offset=`; a limit above the maximum is lowered to it, never refused."""

    default_limit = 50
    max_limit = 500
