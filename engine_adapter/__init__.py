"""engine_adapter"""
