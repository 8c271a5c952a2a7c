"""Signing in and out of the UI: Django's auth, staff users only, each attempt audited (ui_sign_in)."""

from django.contrib.auth import logout
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.exceptions import ValidationError
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from pantheon_site.audit import record_audit_event, request_actor
from pantheon_site.errors import Unauthorized


class StaffAuthenticationForm(AuthenticationForm):
    """A valid password is not enough: the account must be active staff."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        if not user.is_staff:
            raise ValidationError("this account is not a staff account", code="not_staff")


class StaffLoginView(LoginView):
    template_name = "admin_ui/login.html"
    authentication_form = StaffAuthenticationForm
    redirect_authenticated_user = False

    def form_valid(self, form):
        response = super().form_valid(form)
        actor = {**request_actor(self.request), "actor_kind": "user", "actor_label": form.get_user().get_username()}
        record_audit_event("ui_sign_in", "accepted", **actor)
        return response

    def form_invalid(self, form):
        username = (form.data.get("username") or "")[:100]
        actor = {**request_actor(self.request), "actor_kind": "user", "actor_label": username}
        record_audit_event("ui_sign_in", "refused", error=Unauthorized(reason="bad_credentials"), **actor)
        return super().form_invalid(form)


@require_POST
def sign_out(request):
    logout(request)
    return redirect("ui:login")
