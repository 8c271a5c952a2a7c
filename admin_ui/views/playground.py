"""PLACEHOLDER by audit-page helper; delete me."""


def page(request):
    raise NotImplementedError
