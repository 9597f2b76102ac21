import pytest

from frontend.access import SESSION_KEY


@pytest.fixture
def signed_in(client):
    """`signed_in(user, tenant=None)`: the test client, signed in, showing `tenant`."""

    def sign_in(user, tenant=None):
        client.force_login(user)
        if tenant is not None:
            session = client.session
            session[SESSION_KEY] = tenant.name
            session.save()
        return client

    return sign_in
