"""OpenAI's Files and Batch API routes (docs/api/batches.md)."""

from django.urls import path

from batches import views

urlpatterns = [
    path("v1/files", views.file_collection),
    path("v1/files/<str:file_id>", views.file_item),
    path("v1/files/<str:file_id>/content", views.file_content),
    path("v1/batches", views.batch_collection),
    path("v1/batches/<str:batch_id>", views.batch_item),
    path("v1/batches/<str:batch_id>/cancel", views.batch_cancel),
]
