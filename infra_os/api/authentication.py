from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from infra_os.services.tokens import api_token_authenticate


class ApiTokenAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer ogai_…` (the word `Token` is accepted too)."""

    keywords = ("bearer", "token")

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].decode(errors="replace").lower() not in self.keywords:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Send the header as 'Authorization: Bearer <token>'."
            )
        try:
            secret = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token is not valid text.") from None
        token = api_token_authenticate(secret)
        if token is None:
            raise exceptions.AuthenticationFailed("The token is unknown, expired or revoked.")
        return token.user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "infra_os.api.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "An OGAI API token."}
