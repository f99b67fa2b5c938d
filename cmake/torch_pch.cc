// Anchor for the shared torch precompiled header (cmake/BallastTorch.cmake).
