"""Networks in and out of LUCID: ONNX export of a run's networks and of VNN-COMP queries (ONNX +
VNN-LIB), and import of networks trained elsewhere (ONNX or PyTorch state dicts) into a run
directory (docs/interop.md)."""

from lucid.interop.exporter import export_all, export_network, export_query
from lucid.interop.importer import import_run

__all__ = ["export_all", "export_network", "export_query", "import_run"]
