"""The mirrored table as Lance (``pylance``): fragments, deletion files, versions committed by the driver."""
