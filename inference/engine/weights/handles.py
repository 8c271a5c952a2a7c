"""The handles a trainer rebuilds the served weights from, and the rebuild itself (the trainer's side).

Each storage is described once, with the fields PyTorch's own reducer emits (byte fields base64), and every
parameter as a view of one of them. Sharing a storage once and rebuilding it once keeps CUDA's IPC reference counts
balanced: a storage rebuilt per tied name would release a count that was never opened, and never be freed. On a CPU
host the storage is the shared-memory file of the load's arena, named by its path.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef, rebuild_cuda_tensor, shared_cache

from inference.engine.weights.parameter_views import ParameterViews


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def export_handles(views: ParameterViews) -> dict[str, Any]:
    """`storages` (one entry per distinct storage, in the order the parameters first use them), `parameters` (each
    a view: storage index, dtype, shape, stride, offset in elements from the storage's start), `pinned_bytes` (what
    the storages hold) and `producer` (this process's torch and CUDA build, which the trainer's must match; the
    driver is None, as torch does not report its version)."""
    storages: list[dict[str, Any]] = []
    index: dict[tuple[torch.device, int], int] = {}
    parameters = []
    for name, view in views.views.items():
        storage = view.untyped_storage()
        key = (storage.device, storage.data_ptr())
        if key not in index:
            index[key] = len(storages)
            storages.append(_cuda_entry(storage) if storage.device.type == "cuda" else _cpu_entry(storage, views))
        parameters.append(
            {
                "name": name,
                "storage": index[key],
                "dtype": str(view.dtype).removeprefix("torch."),
                "shape": list(view.shape),
                "stride": list(view.stride()),
                "storage_offset": (view.data_ptr() - storage.data_ptr()) // view.element_size(),
                "requires_grad": view.requires_grad,
            }
        )
    return {
        "storages": storages,
        "parameters": parameters,
        "pinned_bytes": sum(entry["storage_size_bytes"] for entry in storages),
        "producer": {"torch": str(torch.__version__), "cuda": torch.version.cuda, "driver": None},
    }


def _cpu_entry(storage: torch.UntypedStorage, views: ParameterViews) -> dict[str, Any]:
    arena = views.arena
    if arena is None or storage.data_ptr() != arena.tensor.untyped_storage().data_ptr():
        raise ValueError("these CPU weights are not in a shared arena: only an attachable load can be exported")
    return {
        "kind": "cpu_shared_file",
        "path": arena.path,
        "handle": _b64(arena.path.encode("utf-8")),
        "device": "cpu",
        "device_index": None,
        "device_uuid": None,
        "storage_size_bytes": storage.nbytes(),
        "storage_offset_bytes": arena.tensor.storage_offset(),  # uint8: elements are bytes
        "ref_counter_handle": None,
        "ref_counter_offset": None,
        "event_handle": None,
        "event_sync_required": False,
    }


def _cuda_entry(storage: torch.UntypedStorage) -> dict[str, Any]:
    """What torch.multiprocessing's reducer sends for a CUDA storage. Untested here: this host has no GPU."""
    (device, handle, size_bytes, offset_bytes, ref_handle, ref_offset, event_handle, event_sync) = (
        storage._share_cuda_()
    )
    shared_cache[handle] = StorageWeakRef(storage)  # as the reducer does: a handle coming back finds its storage
    return {
        "kind": "cuda_ipc",
        "device": f"cuda:{device}",
        "device_index": device,
        "device_uuid": str(torch.cuda.get_device_properties(device).uuid),
        "handle": _b64(handle),
        "storage_size_bytes": size_bytes,
        "storage_offset_bytes": offset_bytes,
        "ref_counter_handle": _b64(ref_handle),
        "ref_counter_offset": ref_offset,
        "event_handle": _b64(event_handle),
        "event_sync_required": event_sync,
    }


def rebuild_parameters(body: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The trainer's side of export_handles: every storage opened exactly once, every parameter a view of its
    storage with the requires_grad it was exported with. ValueError when the producer's torch or CUDA build is not
    this process's (the handles' layout is theirs), or a storage cannot be opened."""
    producer = body["producer"]
    if (producer["torch"], producer["cuda"]) != (str(torch.__version__), torch.version.cuda):
        raise ValueError(
            f"the weights were exported by torch {producer['torch']} (CUDA {producer['cuda']}); this process has "
            f"torch {torch.__version__} (CUDA {torch.version.cuda})"
        )
    storages = [_rebuild_storage(entry) for entry in body["storages"]]
    tensors = {}
    for p in body["parameters"]:
        dtype = getattr(torch, p["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{p['name']}: unknown dtype {p['dtype']!r}")
        storage = storages[p["storage"]]
        tensor = torch.empty(0, dtype=dtype, device=storage.device)
        tensor.set_(storage, p["storage_offset"], tuple(p["shape"]), tuple(p["stride"]))
        tensors[p["name"]] = tensor.requires_grad_(p["requires_grad"])
    return tensors


def _rebuild_storage(entry: dict[str, Any]) -> torch.UntypedStorage:
    size = entry["storage_size_bytes"]
    if entry["kind"] == "cpu_shared_file":
        path = entry["path"]
        # torch.from_file creates a missing file: check first, or an unloaded model would attach as zeros
        if not os.path.isfile(path) or os.path.getsize(path) < size:
            raise ValueError(f"the weights file {path} is gone or shorter than {size} bytes: was the model unloaded?")
        return torch.from_file(path, shared=True, size=size, dtype=torch.uint8).untyped_storage()
    if entry["kind"] == "cuda_ipc":
        whole = rebuild_cuda_tensor(
            torch.Tensor,
            (size,),
            (1,),
            0,
            torch.UntypedStorage,
            torch.uint8,
            _local_cuda_index(entry["device_uuid"]),
            _unb64(entry["handle"]),
            size,
            entry["storage_offset_bytes"],
            False,
            _unb64(entry["ref_counter_handle"]),
            entry["ref_counter_offset"],
            _unb64(entry["event_handle"]),
            entry["event_sync_required"],
        )
        return whole.untyped_storage()
    raise ValueError(f"unknown storage kind {entry['kind']!r}")


def _local_cuda_index(uuid: str) -> int:
    """This process's index of the card named by `uuid`: indices differ between processes (CUDA_VISIBLE_DEVICES)."""
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise ValueError(f"no visible CUDA device has the UUID {uuid}")
